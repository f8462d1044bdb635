// How many cycles a wgmma costs, as the SM90 kernel issues them (PERF.md, v5). Per CTA, two
// warpgroups each issue 32 x 36 m64nNk16 fp16 wgmmas (batches of 4, two batches in flight) with B
// from a K-major 128-byte-swizzled tile; thread 0 of each warpgroup writes its cycle count to lse.
// The kernels take the prefill's parameter struct so that the package's loader can launch them
// (wgmma_cost.py). Build: nvcc -fatbin -gencode=arch=compute_90a,code=sm_90a -std=c++17 -O3
//   --expt-relaxed-constexpr -I kernels -I <cutlass>/include -o wgmma_cost.fatbin ci/microbench/wgmma_cost.cu
#include "params.h"
#include "sm90/device_helpers.cuh"
using namespace cute;
using sparse_mla::sm90::e4m3x4_to_half2x2;

template <int N, bool kRS, int kChains>
__device__ void bench(const SparseMlaParams& p) {
    extern __shared__ __align__(1024) uint8_t smem[];
    const int tid = threadIdx.x;
    if (tid >= 256) return;
    const int wg = tid / 128, wg_tid = tid % 128;
    using LB = decltype(tile_to_shape(GMMA::Layout_K_SW128_Atom<half_t>{}, Shape<Int<N>, _64>{}));
    using LA = decltype(tile_to_shape(GMMA::Layout_K_SW128_Atom<half_t>{}, Shape<_64, _64>{}));
    half_t* base = reinterpret_cast<half_t*>(smem);
    for (int i = tid; i < N * 64 + 64 * 64; i += 256) base[i] = half_t(0.001f * (i % 7));
    __syncthreads();
    Tensor sB = make_tensor(make_smem_ptr(base), LB{});
    Tensor sA = make_tensor(make_smem_ptr(base + N * 64), LA{});
    using AtomRS = std::conditional_t<N == 32, SM90_64x32x16_F32F16F16_RS<GMMA::Major::K, GMMA::Major::K>,
                   std::conditional_t<N == 64, SM90_64x64x16_F32F16F16_RS<GMMA::Major::K, GMMA::Major::K>,
                   std::conditional_t<N == 128, SM90_64x128x16_F32F16F16_RS<GMMA::Major::K, GMMA::Major::K>,
                                                SM90_64x256x16_F32F16F16_RS<GMMA::Major::K, GMMA::Major::K>>>>;
    using AtomSS = std::conditional_t<N == 32, SM90_64x32x16_F32F16F16_SS<GMMA::Major::K, GMMA::Major::K>,
                   std::conditional_t<N == 64, SM90_64x64x16_F32F16F16_SS<GMMA::Major::K, GMMA::Major::K>,
                   std::conditional_t<N == 128, SM90_64x128x16_F32F16F16_SS<GMMA::Major::K, GMMA::Major::K>,
                                                SM90_64x256x16_F32F16F16_SS<GMMA::Major::K, GMMA::Major::K>>>>;
    using Atom = std::conditional_t<kRS, AtomRS, AtomSS>;
    auto mma = make_tiled_mma(Atom{});
    auto thr = mma.get_thread_slice(wg_tid);
    Tensor tB = thr.partition_fragment_B(sB);  // (.., 1, 4)
    Tensor tA = thr.partition_fragment_A(sA);
    Tensor acc = partition_fragment_C(mma, Shape<_64, Int<N>>{});
    Tensor acc2 = partition_fragment_C(mma, Shape<_64, Int<N>>{});
    clear(acc);
    if constexpr (kChains == 2) clear(acc2);
    // RS: A registers from a fixed pattern (no conversion in the loop)
    auto rAf = make_fragment_like<half_t>(thr.partition_A(sA)(_, _, 0));
    for (int i = 0; i < size(rAf); ++i) rAf(i) = half_t(0.01f * (i + 1));
    const long long t0 = clock64();
    for (int rep = 0; rep < 32; ++rep) {
        CUTE_UNROLL
        for (int b = 0; b < 9; ++b) {
            warpgroup_fence_operand(acc);
            if constexpr (kChains == 2) warpgroup_fence_operand(acc2);
            warpgroup_arrive();
            CUTE_UNROLL
            for (int j = 0; j < 4; ++j) {
                auto& c = (kChains == 2 && (j % 2)) ? acc2 : acc;
                if constexpr (kRS) gemm(mma, rAf, tB(_, _, j), c);
                else gemm(mma, tA(_, _, j), tB(_, _, j), c);
            }
            warpgroup_commit_batch();
            warpgroup_wait<1>();
        }
    }
    warpgroup_wait<0>();
    warpgroup_fence_operand(acc);
    if constexpr (kChains == 2) warpgroup_fence_operand(acc2);
    const long long cycles = clock64() - t0;
    float sum = 0.f;
    for (int i = 0; i < size(acc); ++i) sum += acc(i);
    if constexpr (kChains == 2) for (int i = 0; i < size(acc); ++i) sum += acc2(i);
    if (wg_tid == 0) p.lse[blockIdx.x * p.lse_stride_s + wg] = static_cast<float>(cycles);
    p.max_logits[blockIdx.x * p.max_logits_stride_s + (tid % 64)] = sum;
}

#define K(name, N, RS, CH) extern "C" __global__ void __launch_bounds__(384, 1) name(const __grid_constant__ SparseMlaParams p) { bench<N, RS, CH>(p); }
K(rs32, 32, true, 1)
K(rs64, 64, true, 1)
K(rs128, 128, true, 1)
K(ss32, 32, false, 1)
K(ss64, 64, false, 1)
K(ss256, 256, false, 1)
K(rs32c2, 32, true, 2)

// v5's QK^T loop, as in kernels/sm90/prefill_kernel.cuh at that version: RS m64n32k16 over a 32 x 576
// K-major SW128 tile, A from e4m3 fragments in smem converted per batch (kConvert), descriptors
// walking the 9 atom columns (kWalk) or staying in the first.
template <bool kConvert, bool kWalk>
__device__ void qk_mimic(const SparseMlaParams& p) {
    extern __shared__ __align__(1024) uint8_t smem[];
    const int tid = threadIdx.x;
    if (tid >= 256) return;
    const int wg_tid = tid % 128, wg = tid / 128;
    using L = decltype(tile_to_shape(GMMA::Layout_K_SW128_Atom<half_t>{}, Shape<_32, Int<576>>{}));
    half_t* kt = reinterpret_cast<half_t*>(smem);
    uint2* q_frag = reinterpret_cast<uint2*>(smem + 32 * 576 * 2);
    for (int i = tid; i < 32 * 576; i += 256) kt[i] = half_t(0.001f * (i % 7));
    for (int i = tid; i < 36 * 128; i += 256) q_frag[i] = make_uint2(0x38303830u + i, 0x30383038u);
    __syncthreads();
    Tensor sK = make_tensor(make_smem_ptr(kt), L{});
    auto mma = make_tiled_mma(SM90_64x32x16_F32F16F16_RS<GMMA::Major::K, GMMA::Major::K>{});
    const uint64_t k_desc = static_cast<uint64_t>(mma.get_thread_slice(wg_tid).partition_fragment_B(sK)(0, 0, 0));
    float sum = 0.f;
    const long long t0 = clock64();
    for (int rep = 0; rep < 32; ++rep) {
        float s[16];
        auto qk_batch = [&](uint32_t (&a)[4][4], int batch) {
            CUTE_UNROLL
            for (int j = 0; j < 4; ++j) {
                if constexpr (kConvert) {
                    const uint2 e4m3 = q_frag[(batch * 4 + j) * 128 + wg_tid];
                    const uint2 lo = e4m3x4_to_half2x2(e4m3.x), hi = e4m3x4_to_half2x2(e4m3.y);
                    a[j][0] = lo.x;
                    a[j][1] = lo.y;
                    a[j][2] = hi.x;
                    a[j][3] = hi.y;
                } else {
                    a[j][0] = a[j][1] = a[j][2] = a[j][3] = 0x3c003c00u;
                }
            }
            CUTE_UNROLL
            for (int i = 0; i < 16; ++i) warpgroup_fence_operand(s[i]);
            warpgroup_arrive();
            CUTE_UNROLL
            for (int j = 0; j < 4; ++j) {
                const int ks = batch * 4 + j;
                const uint64_t desc = k_desc + L{}(0, (kWalk ? ks : ks % 4) * 16) * sizeof(half_t) / 16;
                SM90_64x32x16_F32F16F16_RS<GMMA::Major::K, GMMA::Major::K>::fma(a[j][0], a[j][1], a[j][2], a[j][3], desc,
                    s[0], s[1], s[2], s[3], s[4], s[5], s[6], s[7], s[8], s[9], s[10], s[11], s[12], s[13], s[14], s[15],
                    ks == 0 ? GMMA::ScaleOut::Zero : GMMA::ScaleOut::One);
            }
            warpgroup_commit_batch();
            warpgroup_wait<1>();
        };
        uint32_t a_even[4][4], a_odd[4][4];
        CUTE_UNROLL
        for (int batch = 0; batch < 9; batch += 2) {
            qk_batch(a_even, batch);
            if (batch + 1 < 9) qk_batch(a_odd, batch + 1);
        }
        warpgroup_wait<0>();
        CUTE_UNROLL
        for (int i = 0; i < 16; ++i) { warpgroup_fence_operand(s[i]); sum += s[i]; }
    }
    const long long cycles = clock64() - t0;
    if (wg_tid == 0) p.lse[blockIdx.x * p.lse_stride_s + wg] = static_cast<float>(cycles);
    p.max_logits[blockIdx.x * p.max_logits_stride_s + (tid % 64)] = sum;
}
#define Q(name, C, W) extern "C" __global__ void __launch_bounds__(384, 1) name(const __grid_constant__ SparseMlaParams p) { qk_mimic<C, W>(p); }
Q(qk_cw, true, true)
Q(qk_nw, false, true)
Q(qk_cn, true, false)
Q(qk_nn, false, false)
