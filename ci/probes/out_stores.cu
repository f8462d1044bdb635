// What an item's out costs to store (PERF.md, "Out's stores"): persistent CTAs of 128 threads (one
// consumer warpgroup) take 4096 items of 64 KB each (an item's out at 64 heads, 268 MB in all), as
// the 64-head kernels do, and store each item's out:
//   1. after a dependent FMA chain (the item's math), from registers (STG) or staged in shared memory
//      and written by one bulk copy (the TMA unit), at 1, 2 and 4 CTAs per SM: whether the stores
//      run under the next item's math;
//   2. the same after a gather of 4 or 16 half tiles per item (32 random 512-byte rows of a 4 MB kv
//      that L2 holds, by cp.async, double-buffered) with the chain on each: whether they slow it;
//   3. on 1 to 4 CTAs alone and on every SM: the store rate by pattern, each STG.128 of a warp writing
//      4 rows x 128 bytes, 8 x 64 (the kernels' quad-transposed rows) or 16 x 32.
// Built and run by `ci/gpu.sh stores` on the GPU machine (a program of its own: no package, no torch).
#include <cuda_runtime.h>

#include <cstdint>
#include <cstdio>

namespace {

constexpr int kItems = 4096, kItemBytes = 65536, kThreads = 128, kStoresPerThread = kItemBytes / kThreads / 16;
constexpr int kHalfTileBytes = 32 * 512, kKvRows = 8192;

enum Out { kNoOut, kStg, kBulk };

__device__ __forceinline__ float chain(float x, int n) {
    for (int i = 0; i < n; ++i) x = fmaf(x, 1.0000001f, 0.5f);
    return x;
}

__device__ __forceinline__ uint32_t hash(uint32_t x) {
    x ^= x >> 16;
    x *= 0x7feb352du;
    x ^= x >> 15;
    x *= 0x846ca68bu;
    return x ^ (x >> 16);
}

// One item's out: kStg from registers (each warp instruction 512 contiguous bytes), kBulk through
// shared memory at `stage` (the copy before it waited for) by one bulk copy.
template <Out kOut>
__device__ __forceinline__ void store_item(uint8_t* out, int item, uint32_t v, uint32_t stage) {
    uint8_t* dst = out + static_cast<size_t>(item) * kItemBytes;
    if constexpr (kOut == kStg) {
#pragma unroll
        for (int i = 0; i < kStoresPerThread; ++i)
            *reinterpret_cast<uint4*>(dst + i * kThreads * 16 + threadIdx.x * 16) = make_uint4(v, v + i, v ^ i, item);
    } else if constexpr (kOut == kBulk) {
        if (threadIdx.x == 0) asm volatile("cp.async.bulk.wait_group.read 0;" ::: "memory");
        __syncthreads();
#pragma unroll
        for (int i = 0; i < kStoresPerThread; ++i)
            asm volatile("st.shared.v4.u32 [%0], {%1, %2, %3, %4};" ::"r"(stage + i * kThreads * 16 + threadIdx.x * 16), "r"(v),
                         "r"(v + i), "r"(v ^ i), "r"(item));
        asm volatile("fence.proxy.async.shared::cta;" ::: "memory");
        __syncthreads();
        if (threadIdx.x == 0) {
            asm volatile("cp.async.bulk.global.shared::cta.bulk_group [%0], [%1], %2;" ::"l"(dst), "r"(stage), "r"(kItemBytes)
                         : "memory");
            asm volatile("cp.async.bulk.commit_group;" ::: "memory");
        }
    }
}

__device__ __forceinline__ void finish(Out out, float x, float* sink) {
    if (out == kBulk && threadIdx.x == 0) asm volatile("cp.async.bulk.wait_group 0;" ::: "memory");
    if (x == 12345.f) sink[threadIdx.x] = x;  // keeps the chain
}

// 1: each item a chain of n FMAs, then its out.
template <Out kOut>
__global__ void __launch_bounds__(kThreads) after_math(uint8_t* out, int n, float* sink) {
    extern __shared__ __align__(128) uint8_t smem[];
    const uint32_t stage = static_cast<uint32_t>(__cvta_generic_to_shared(smem));
    float x = threadIdx.x;
    for (int item = blockIdx.x; item < kItems; item += gridDim.x) {
        x = chain(x, n);
        store_item<kOut>(out, item, __float_as_uint(x), stage);
    }
    finish(kOut, x, sink);
}

// 2: each item `halves` half tiles gathered (four threads a row, one ahead), a chain of n FMAs on
// each, then its out.
template <Out kOut>
__global__ void __launch_bounds__(kThreads) after_gather(const uint8_t* kv, uint8_t* out, int halves, int n, float* sink) {
    extern __shared__ __align__(128) uint8_t smem[];
    const uint32_t ring = static_cast<uint32_t>(__cvta_generic_to_shared(smem)), stage = ring + 2 * kHalfTileBytes;
    const int row = threadIdx.x / 4, part = threadIdx.x % 4;
    int gathered = 0;
    auto gather = [&](int item, int half) {
        const uint8_t* src = kv + static_cast<size_t>(hash(item * 64 + half * 32 + row) % kKvRows) * 512 + part * 128;
        const uint32_t dst = ring + (gathered++ % 2) * kHalfTileBytes + row * 512 + part * 128;
#pragma unroll
        for (int k = 0; k < 8; ++k)
            asm volatile("cp.async.cg.shared.global [%0], [%1], 16;" ::"r"(dst + 16 * k), "l"(src + 16 * k) : "memory");
        asm volatile("cp.async.commit_group;" ::: "memory");
    };
    float x = threadIdx.x;
    if (blockIdx.x < kItems) gather(blockIdx.x, 0);
    for (int item = blockIdx.x; item < kItems; item += gridDim.x) {
        for (int half = 0; half < halves; ++half) {
            const int next = half + 1 < halves ? item : item + gridDim.x;
            if (next < kItems) gather(next, half + 1 < halves ? half + 1 : 0);
            else asm volatile("cp.async.commit_group;" ::: "memory");
            asm volatile("cp.async.wait_group 1;" ::: "memory");
            __syncthreads();
            const float* t = reinterpret_cast<const float*>(smem + (gathered % 2) * kHalfTileBytes);
            x = chain(x + t[threadIdx.x] * 1e-30f + t[(threadIdx.x * 33) % 4096] * 1e-30f, n);
            __syncthreads();
        }
        store_item<kOut>(out, item, __float_as_uint(x), stage);
    }
    asm volatile("cp.async.wait_group 0;" ::: "memory");
    finish(kOut, x, sink);
}

// 3: each STG.128 of a warp kRowBytes of each of 512 / kRowBytes rows (1 KB apart, an item 64 rows).
template <int kRowBytes>
__global__ void __launch_bounds__(kThreads) by_pattern(uint8_t* out, int items) {
    constexpr int kLanesPerRow = kRowBytes / 16, kRowsPerStore = 32 / kLanesPerRow, kGroups = 16 / kRowsPerStore;
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
    for (int item = blockIdx.x; item < items; item += gridDim.x) {
        uint8_t* base = out + static_cast<size_t>(item) * kItemBytes;
#pragma unroll 4
        for (int i = 0; i < kStoresPerThread; ++i) {
            const int row = 16 * warp + (i % kGroups) * kRowsPerStore + lane / kLanesPerRow;
            const int col = (i / kGroups) * kRowBytes + (lane % kLanesPerRow) * 16;
            *reinterpret_cast<uint4*>(base + row * 1024 + col) = make_uint4(i, item, lane, row);
        }
    }
}

// The best of ten launches after three, µs.
template <class Launch>
float best_us(Launch launch) {
    cudaEvent_t a, b;
    cudaEventCreate(&a);
    cudaEventCreate(&b);
    for (int i = 0; i < 3; ++i) launch();
    float best = 1e30f;
    for (int i = 0; i < 10; ++i) {
        cudaEventRecord(a);
        launch();
        cudaEventRecord(b);
        cudaEventSynchronize(b);
        float ms;
        cudaEventElapsedTime(&ms, a, b);
        best = ms < best ? ms : best;
    }
    cudaEventDestroy(a);
    cudaEventDestroy(b);
    return best * 1e3f;
}

template <Out kOut>
float time_after_math(uint8_t* out, int grid, int n, float* sink) {
    const int smem = kOut == kBulk ? kItemBytes : 0;
    cudaFuncSetAttribute(after_math<kOut>, cudaFuncAttributeMaxDynamicSharedMemorySize, smem);
    return best_us([&] { after_math<kOut><<<grid, kThreads, smem>>>(out, n, sink); });
}

template <Out kOut>
float time_after_gather(const uint8_t* kv, uint8_t* out, int grid, int halves, int n, float* sink) {
    const int smem = 2 * kHalfTileBytes + (kOut == kBulk ? kItemBytes : 0);
    cudaFuncSetAttribute(after_gather<kOut>, cudaFuncAttributeMaxDynamicSharedMemorySize, smem);
    return best_us([&] { after_gather<kOut><<<grid, kThreads, smem>>>(kv, out, halves, n, sink); });
}

template <int kRowBytes>
float time_by_pattern(uint8_t* out, int grid, int items) {
    return best_us([&] { by_pattern<kRowBytes><<<grid, kThreads>>>(out, items); });
}

}  // namespace

int main() {
    int sms;
    cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0);
    uint8_t *out, *kv;
    float* sink;
    cudaMalloc(&out, static_cast<size_t>(kItems) * kItemBytes);
    cudaMalloc(&kv, static_cast<size_t>(kKvRows) * 512);
    cudaMemset(kv, 0, static_cast<size_t>(kKvRows) * 512);
    cudaMalloc(&sink, kThreads * sizeof(float));
    printf("%d SMs; %d items of %d KB of out (%.0f MB); µs, best of 10\n", sms, kItems, kItemBytes / 1024,
           kItems * (kItemBytes / 1e6));

    printf("1. after a chain of n FMAs an item: math alone, + STG, + bulk copy (the stores' cost beside it)\n");
    for (int per_sm : {1, 2, 4})
        for (int n : {1000, 2000, 4000, 8000}) {
            const float t0 = time_after_math<kNoOut>(out, sms * per_sm, n, sink);
            const float t1 = time_after_math<kStg>(out, sms * per_sm, n, sink);
            const float t2 = time_after_math<kBulk>(out, sms * per_sm, n, sink);
            printf("   %d CTAs/SM, n %4d: %7.1f  STG %7.1f (+%5.1f)  bulk %7.1f (+%5.1f)\n", per_sm, n, t0, t1, t1 - t0, t2, t2 - t0);
        }
    printf("2. after a gather of h half tiles an item, n FMAs on each: no out, + STG, + bulk copy\n");
    for (int per_sm : {1, 2})
        for (int halves : {4, 16})
            for (int n : {0, 250, 500, 1000}) {
                const float t0 = time_after_gather<kNoOut>(kv, out, sms * per_sm, halves, n, sink);
                const float t1 = time_after_gather<kStg>(kv, out, sms * per_sm, halves, n, sink);
                const float t2 = time_after_gather<kBulk>(kv, out, sms * per_sm, halves, n, sink);
                printf("   %d CTAs/SM, h %2d, n %4d: %7.1f  STG %7.1f (+%5.1f)  bulk %7.1f (+%5.1f)\n", per_sm, halves, n, t0, t1,
                       t1 - t0, t2, t2 - t0);
            }
    printf("3. the store rate by pattern (a warp's STG.128: rows x bytes), GB/s\n");
    for (int grid : {1, 2, 4, sms, 2 * sms}) {
        const int items = grid <= 4 ? 32 * grid : kItems;
        const double mb = items * (kItemBytes / 1e6);
        const float a = time_by_pattern<128>(out, grid, items), b = time_by_pattern<64>(out, grid, items),
                    c = time_by_pattern<32>(out, grid, items);
        printf("   %3d CTAs, %4d items: 4 x 128 B %7.1f (%6.1f)  8 x 64 B %7.1f (%6.1f)  16 x 32 B %7.1f (%6.1f)\n", grid, items, a,
               mb / a * 1e3, b, mb / b * 1e3, c, mb / c * 1e3);
    }
    const cudaError_t e = cudaDeviceSynchronize();
    printf("%s\n", cudaGetErrorString(e));
    return e == cudaSuccess ? 0 : 1;
}
