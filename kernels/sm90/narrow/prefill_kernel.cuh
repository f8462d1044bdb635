// The SM90 FP8 sparse MLA prefill kernels for narrow heads (h_q <= 32, tensor-parallel serving): one
// CTA per query token and all of its heads, so that its tensor work follows the heads asked for (the
// 64-head kernels pad to 64). One template for every QK head dim and 8, 16 or 32 heads.
//
// The math is mma.sync m16n8k16 in fp16 with fp32 accumulators, the e4m3 K and V converted exactly to
// fp16 in registers after ldmatrix from the landing tile (no fp16 copy of V in shared memory, no
// transposed tile); the latency of these chains, not the gather, bounds the kernels (PERF.md). Per
// tile of 64 slots:
//   1. two producer warps gather the e4m3 kv rows (cp.async completing on the tile's mbarrier) into a
//      ring of landing tiles; invalid slots become zero rows with a -inf logit;
//   2. each of a group's 4 warps owns S on 16 slots, all of d_qk (fp32-grade: exact products, fp32
//      sums); heads as M, two warps compute S on their 32 slots together, each over half of d_qk;
//   3. the online softmax, whose maxima and reference every warp of the group holds bit for bit
//      alike: heads as M, each warp makes P of its own slots once the tile's maxima are exchanged,
//      and reads the others' P; heads as N, S^T is exchanged and every warp makes all of P. Each
//      warp then adds P V into its 128 columns of O, in fp32 registers;
//   4. at an item's end, out, and max_logits and lse from the running max and sum.
// Heads are the MMA's M in groups of 16 (heads_as_m.cuh: narrow16, narrow32) or, for 8 heads, its N
// (heads_as_n.cuh: narrow8, the MMAs transposed). The grid is persistent (two CTAs per SM for one
// group, one for two; past its first item, each CTA claims the next from a counter: ring.cuh).
#pragma once

#include <stdint.h>

#include "params.h"
#include "sm90/narrow/config.h"
#include "sm90/narrow/heads_as_m.cuh"
#include "sm90/narrow/heads_as_n.cuh"
#include "sm90/narrow/ring.cuh"
#include "sm90/work.cuh"

namespace sparse_mla::sm90::narrow {

template <int D, int kHeads>
__device__ void prefill_heads(const SparseMlaParams& p) {
    extern __shared__ __align__(1024) uint8_t smem[];
    using L = Layout<D, kHeads>;
    using S = Shape<kHeads>;
    const WorkItems work(p, kHeads);
    const RingBarriers<L::kBuffers> bars{reinterpret_cast<uint64_t*>(smem + L::kBarriers)};
    const RingValidity validity{reinterpret_cast<uint32_t*>(smem + L::kValid)};
    if (threadIdx.x == 0) bars.init(S::kConsumerThreads);
    __syncthreads();
    if (threadIdx.x >= S::kConsumerThreads) {
        produce<D, kHeads, L::kBuffers>(p, work, smem + L::kLanding, smem + L::kQ8, bars, validity, threadIdx.x - S::kConsumerThreads);
    } else if constexpr (S::kHeadsAsN) {
        consume_heads_as_n<D, L::kBuffers>(p, work, smem + L::kLanding, smem + L::kQ8,
                                           reinterpret_cast<uint2*>(smem + L::kQ16), reinterpret_cast<float4*>(smem + L::kX), bars, validity);
    } else {
        consume_heads_as_m<D, S::kGroups, L::kBuffers>(p, work, smem + L::kLanding, smem + L::kQ8,
                                                       reinterpret_cast<uint4*>(smem + L::kQ16), smem + L::kX,
                                                       reinterpret_cast<float4*>(smem + L::kSums),
                                                       reinterpret_cast<float4*>(smem + L::kPartial), bars, validity);
    }
}

}  // namespace sparse_mla::sm90::narrow

// The registry's entries (narrow/config.h).
namespace sparse_mla::sm90::narrow8 {
template <int D>
__device__ void prefill(const SparseMlaParams& p) { narrow::prefill_heads<D, 8>(p); }
}  // namespace sparse_mla::sm90::narrow8
namespace sparse_mla::sm90::narrow16 {
template <int D>
__device__ void prefill(const SparseMlaParams& p) { narrow::prefill_heads<D, 16>(p); }
}  // namespace sparse_mla::sm90::narrow16
namespace sparse_mla::sm90::narrow32 {
template <int D>
__device__ void prefill(const SparseMlaParams& p) { narrow::prefill_heads<D, 32>(p); }
}  // namespace sparse_mla::sm90::narrow32
