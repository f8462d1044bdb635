// The gather floor of the narrow kernel: its ring (producer warp, mbarriers, landing tiles) with
// consumers that only take and release each tile, for the ring depths and CTAs per SM named by the
// entries. Built and run by `ci/gpu.sh floor` on the GPU machine (narrow_gather.py).
#include "sm90/narrow/ring.cuh"

namespace sparse_mla::sm90::narrow {

// The probe's shared memory: the ring of one M tile's kernel at one CTA per SM, up to its q16.
template <int D, int kBuffers>
using GatherLayout = Layout<D, kMTileHeads, kBuffers, 1>;

template <int D, int kBuffers>
__device__ void gather_only(const SparseMlaParams& p) {
    extern __shared__ __align__(1024) uint8_t smem[];
    using L = GatherLayout<D, kBuffers>;
    constexpr int kConsumerThreads = Shape<kMTileHeads>::kConsumerThreads;
    const WorkItems work(p, kMTileHeads);
    const RingBarriers<kBuffers> bars{reinterpret_cast<uint64_t*>(smem + L::kBarriers)};
    const RingValidity validity{reinterpret_cast<uint32_t*>(smem + L::kValid)};
    if (threadIdx.x == 0) bars.init(kConsumerThreads);
    __syncthreads();
    if (threadIdx.x >= kConsumerThreads) {
        produce<D, kMTileHeads, kBuffers>(p, work, smem + L::kLanding, smem + L::kQ8, bars, validity, threadIdx.x - kConsumerThreads);
        return;
    }
    RingCursor at;
    for (;;) {
        const int64_t t = bars.await_item(at.q);
        if (t >= work.n_items) break;
        bars.release_item(at.q);
        const int64_t n_slots = work.slots_of(t);
        for (int tile = 0; tile < WorkItems::tiles_of(n_slots); ++tile, ++at.tile) {
            mbar_wait(bars.full(at.tile % kBuffers), (at.tile / kBuffers) & 1);
            mbar_arrive(bars.empty(at.tile % kBuffers));
        }
    }
}

}  // namespace sparse_mla::sm90::narrow

// Each entry with its shared memory in bytes beside it (NAME_smem), read by narrow_gather.py.
#define NARROW_GATHER_ENTRY(D, B, C)                                                                             \
    extern "C" __device__ const int narrow_gather_d##D##_b##B##_c##C##_smem =                                   \
        sparse_mla::sm90::narrow::GatherLayout<D, B>::kGatherBytes;                                             \
    extern "C" __global__ void __launch_bounds__(sparse_mla::sm90::narrow::Shape<16>::kThreads, C)                \
        narrow_gather_d##D##_b##B##_c##C(const uint8_t* q, const uint8_t* kv, const int32_t* indices,            \
                                         const int32_t* topk_length, int64_t s_q, int64_t s_kv, int64_t h_q,     \
                                         int64_t topk, int64_t q_stride_s, int64_t q_stride_h,                   \
                                         int64_t kv_stride_s, int64_t indices_stride_s) {                        \
        SparseMlaParams p{};                                                                                     \
        p.q = q, p.kv = kv, p.indices = indices, p.topk_length = topk_length, p.topk_length_stride = 1;         \
        p.s_q = s_q, p.s_kv = s_kv, p.h_q = h_q, p.topk = topk, p.d_qk = D, p.d_v = 512;                        \
        p.q_stride_s = q_stride_s, p.q_stride_h = q_stride_h, p.kv_stride_s = kv_stride_s;                     \
        p.indices_stride_s = indices_stride_s, p.rows_16b_aligned = true;                                       \
        sparse_mla::sm90::narrow::gather_only<D, B>(p);                                                          \
    }
#define NARROW_GATHER_DIM(D) \
    NARROW_GATHER_ENTRY(D, 2, 1) NARROW_GATHER_ENTRY(D, 3, 1) NARROW_GATHER_ENTRY(D, 4, 1) NARROW_GATHER_ENTRY(D, 2, 2)
NARROW_GATHER_DIM(512)
NARROW_GATHER_DIM(576)
