// What a 2-CTA cluster pays to add two partial S (PERF.md, Next steps, "A design with fewer O
// registers per thread"; by name, since the items are renumbered): the round trip of 16 KB
// (one warpgroup's fp32 S of a tile) or 32 KB between the two CTAs' shared memory, each CTA sending
// its part and waiting for its peer's, cycles an exchange, on 1 and on 66 clusters:
//   V1: 128 threads store through the peer's mapped address (st.shared::cluster), then barrier.cluster;
//   V2: one thread's cp.async.bulk shared::cta -> shared::cluster completing on the peer's mbarrier
//       (expect_tx by the receiver), the receiver's wait on it, and a remote arrive once it has read.
// Built and run by `ci/gpu.sh cluster` on the GPU machine (a program of its own).
#include <cooperative_groups.h>
#include <cuda_runtime.h>

#include <cstdint>
#include <cstdio>
namespace cg = cooperative_groups;

constexpr int kThreads = 128, kIters = 2000;
constexpr int kMaxClusters = 66;  // one per two SMs of an H100 or H200

template <int kBytes>
__global__ void __cluster_dims__(2, 1, 1) __launch_bounds__(kThreads) v1(float* sink, long long* cycles) {
    extern __shared__ __align__(128) float buf[];  // [0, kBytes): what the peer sends me; then my own
    cg::cluster_group cluster = cg::this_cluster();
    const unsigned rank = cluster.block_rank();
    float* peer = cluster.map_shared_rank(buf, rank ^ 1);
    float* mine = buf + kBytes / 4;
    for (int i = threadIdx.x; i < kBytes / 4; i += kThreads) mine[i] = i * 0.5f + rank;
    cluster.sync();
    float acc = 0.f;
    const long long t0 = clock64();
    for (int it = 0; it < kIters; ++it) {
        for (int i = threadIdx.x * 4; i < kBytes / 4; i += kThreads * 4)
            *reinterpret_cast<float4*>(peer + i) = *reinterpret_cast<const float4*>(mine + i);
        cluster.sync();
        acc += buf[threadIdx.x * 4 + (it & 7)];
        cluster.sync();  // the peer read before it is overwritten
    }
    const long long t1 = clock64();
    if (threadIdx.x == 0 && rank == 0) cycles[blockIdx.x] = (t1 - t0) / kIters;
    if (acc == 1234.5f) sink[threadIdx.x] = acc;
}

__device__ __forceinline__ uint32_t smem_u32(const void* p) { return static_cast<uint32_t>(__cvta_generic_to_shared(p)); }

// Until the mbarrier at shared address bar has completed the phase of this parity.
__device__ __forceinline__ void wait_parity(uint32_t bar, uint32_t parity) {
    asm volatile("{\n.reg .pred p;\nW: mbarrier.try_wait.parity.shared::cta.b64 p, [%0], %1;\n@!p bra W;\n}" ::"r"(bar), "r"(parity)
                 : "memory");
}

template <int kBytes>
__global__ void __cluster_dims__(2, 1, 1) __launch_bounds__(kThreads) v2(float* sink, long long* cycles) {
    extern __shared__ __align__(128) float buf[];  // [0, kBytes): received; [kBytes, 2 kBytes): mine
    __shared__ __align__(8) uint64_t full;        // my receive buffer is full (the peer's copy landed)
    __shared__ __align__(8) uint64_t free_;       // the peer's receive buffer is free (it read it)
    cg::cluster_group cluster = cg::this_cluster();
    const unsigned rank = cluster.block_rank(), peer_rank = rank ^ 1;
    float* mine = buf + kBytes / 4;
    for (int i = threadIdx.x; i < kBytes / 4; i += kThreads) mine[i] = i * 0.5f + rank;
    if (threadIdx.x == 0) {
        asm volatile("mbarrier.init.shared::cta.b64 [%0], 1;" ::"r"(smem_u32(&full)));
        asm volatile("mbarrier.init.shared::cta.b64 [%0], 1;" ::"r"(smem_u32(&free_)));
        asm volatile("fence.mbarrier_init.release.cluster;");
    }
    cluster.sync();
    uint32_t peer_buf, peer_full, peer_free;
    asm volatile("mapa.shared::cluster.u32 %0, %1, %2;" : "=r"(peer_buf) : "r"(smem_u32(buf)), "r"(peer_rank));
    asm volatile("mapa.shared::cluster.u32 %0, %1, %2;" : "=r"(peer_full) : "r"(smem_u32(&full)), "r"(peer_rank));
    asm volatile("mapa.shared::cluster.u32 %0, %1, %2;" : "=r"(peer_free) : "r"(smem_u32(&free_)), "r"(peer_rank));
    float acc = 0.f;
    const long long t0 = clock64();
    for (int it = 0; it < kIters; ++it) {
        const uint32_t phase = it & 1;
        if (threadIdx.x == 0) {
            // my buffer will receive kBytes this phase
            asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;" ::"r"(smem_u32(&full)), "r"(kBytes) : "memory");
            // the peer's buffer is free once it read the last one (not on the first iteration)
            if (it > 0) wait_parity(smem_u32(&free_), phase ^ 1);
            asm volatile(
                "cp.async.bulk.shared::cluster.shared::cta.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];" ::"r"(peer_buf),
                "r"(smem_u32(mine)), "r"(kBytes), "r"(peer_full) : "memory");
        }
        wait_parity(smem_u32(&full), phase);
        acc += buf[threadIdx.x * 4 + (it & 7)];
        __syncthreads();  // every thread read: tell the peer its next copy may come
        if (threadIdx.x == 0)
            asm volatile("mbarrier.arrive.release.cluster.shared::cluster.b64 _, [%0];" ::"r"(peer_free) : "memory");
    }
    const long long t1 = clock64();
    if (threadIdx.x == 0 && rank == 0) cycles[blockIdx.x] = (t1 - t0) / kIters;
    cluster.sync();  // no CTA exits while its peer may still write to it
    if (acc == 1234.5f) sink[threadIdx.x] = acc;
}

template <class K>
bool run(const char* name, K kernel, int bytes, int clusters, float* sink, long long* cycles) {
    const int smem = 2 * bytes;
    cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, smem);
    kernel<<<2 * clusters, kThreads, smem>>>(sink, cycles);
    cudaError_t e = cudaDeviceSynchronize();
    if (e != cudaSuccess) {
        printf("%s: %s\n", name, cudaGetErrorString(e));
        return false;
    }
    long long c[2 * kMaxClusters];
    cudaMemcpy(c, cycles, sizeof(long long) * 2 * clusters, cudaMemcpyDeviceToHost);
    long long lo = 1LL << 62, hi = 0;
    for (int i = 0; i < 2 * clusters; i += 2) lo = c[i] < lo ? c[i] : lo, hi = c[i] > hi ? c[i] : hi;
    printf("%-34s %6d B, %3d clusters: %5lld-%5lld cycles an exchange\n", name, bytes, clusters, lo, hi);
    return true;
}

int main() {
    float* sink;
    long long* cycles;
    cudaMalloc(&sink, 4096);
    cudaMalloc(&cycles, 2 * kMaxClusters * sizeof(long long));
    bool ok = true;
    for (int clusters : {1, kMaxClusters}) {
        ok &= run("V1 st.shared::cluster + cluster.sync x2", v1<16384>, 16384, clusters, sink, cycles);
        ok &= run("V1 st.shared::cluster + cluster.sync x2", v1<32768>, 32768, clusters, sink, cycles);
        ok &= run("V2 bulk copy + mbarriers", v2<16384>, 16384, clusters, sink, cycles);
        ok &= run("V2 bulk copy + mbarriers", v2<32768>, 32768, clusters, sink, cycles);
    }
    return ok ? 0 : 1;
}
