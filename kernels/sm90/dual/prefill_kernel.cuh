// The SM90 FP8 sparse MLA prefill kernel for one block of 64 heads at small topk: two CTAs per SM,
// each one query token x 64 heads, one template for every QK head dim.
//
// At small topk the 64-head kernel's per-item epilogue (output stores, the exact max) runs under no
// wgmma and bounds it (PERF.md). Here each CTA has one consumer warpgroup, which owns the 64 heads
// and all of d_v (O in f16 registers, as in the wide kernel), and one producer warpgroup; with two
// CTAs per SM one CTA's wgmmas run while the other's epilogue does (what that gains, and why not
// more: PERF-HISTORY.md, v18). What two CTAs leave each one
// (~113 KB of shared memory, 256 registers per thread pair) sets the unit of the pipeline: a half
// tile of 32 slots. Per half tile:
//   1. the producer gathers the e4m3 kv rows (cp.async) into a ring of landing half tiles, two ahead
//      (one at d_qk 576; the exact kernel one more); invalid slots become zero rows with a -inf logit;
//   2. the consumer computes S = Q K^T by FP8 wgmma (m64n32k32), promoted per K step (PERF.md);
//   3. meanwhile the producer converts V to fp16 into the one fp16 half tile, once P.V of the one
//      before has read it;
//   4. online softmax in base 2 (validity from the indices), P (fp16) in registers as the A of P.V,
//      O += P V in f16;
//   5. at an item's end, out, and max_logits and lse with the running max's logit recomputed exactly
//      (its Q rows from the Q tile; the next item's Q loads under its sums).
// Under precision "fast" (dual_fast) QK^T's tensor-core sums run over several K steps, the producer
// transposes V into an e4m3 V^T tile instead of converting it, P is e4m3 and P.V an FP8 wgmma
// (m64n256k32) into the same f16 O, and max_logits and lse come from the running max.
// The grid is persistent (Traits::kCtasPerSm CTAs per SM, items taken in turn). (A model of the
// synchronization, checked under random schedules on the CPU: ci/models/dual_sync.py.)
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <math_constants.h>

#include <utility>

#include <cute/atom/mma_traits_sm90_gmma.hpp>
#include <cute/tensor.hpp>

#include "params.h"
#include "sm90/device_helpers.cuh"
#include "sm90/dual/config.h"
#include "sm90/f16_o.cuh"
#include "sm90/work.cuh"

namespace sparse_mla::sm90::dual {

// Named barriers (0 is __syncthreads). A full/empty pair orders a buffer between the producer, which
// arrives on "full" and waits on "empty", and the consumer, which does the opposite.
enum Barrier : int {
    kLandingFullBar0 = 1,                                      // + landing buffer
    kLandingEmptyBar0 = kLandingFullBar0 + kMaxLandingBuffers,  // + landing buffer
    kV16FullBar = kLandingEmptyBar0 + kMaxLandingBuffers,
    kV16EmptyBar,
    kQBar,          // the consumer's own: Q landed
    kProducersBar,  // the producer's own (fast: a half tile landed, from every thread)
};
static_assert(kProducersBar < 16, "sm_90 has 16 named barriers");

// The producer warpgroup: the CTA's half tiles in order across its items, each gathered into the
// ring two ahead of QK^T, then its V converted into the fp16 half tile. A thread owns one row of a
// half tile and in it the 16-byte chunks part + 4 m: one swizzle atom column apart in both tiles.
template <int D, bool kFast>
__device__ void produce_half_tiles(const SparseMlaParams& p, const WorkItems& work, uint8_t* smem) {
    asm volatile("setmaxnreg.dec.sync.aligned.u32 %0;" ::"n"(Traits::kProducerRegisters));
    constexpr int kBuffers = landing_buffers(D, kFast);
    constexpr int kChunksPerThread = D / 16 / 4;
    constexpr int kLandingAtomColumnBytes = kHalfSlots * 64;
    constexpr int kV16AtomColumnBytes = kHalfSlots * 128;
    static_assert(Traits::kProducerThreads == 4 * kHalfSlots, "four threads per row");
    const int ptid = threadIdx.x - Traits::kConsumerThreads, row = ptid / 4, part = ptid % 4;
    uint8_t* landing0 = smem + landing_smem_offset(kFast);
    uint8_t* v16 = smem;
    const uint32_t row_chunk = sw64_chunk(row, part, kHalfSlots);
    const uint32_t landing0_shared = static_cast<uint32_t>(__cvta_generic_to_shared(landing0)) + row_chunk;

    // This CTA's half tiles in order, across its items: the cursor of the next one to gather.
    UnitCursor<kSlotsPerTile / kHalfSlots> next{blockIdx.x};
    // the index of this thread's row in the cursor's half tile (-1 past n_slots), loaded a gather
    // ahead to hide its latency
    auto half_index = [&]() -> int32_t { return next.done(work) ? -1 : next.index(next.slot(row)); };
    auto gather = [&](int buffer, int32_t j) {
        const bool valid = work.in_range(j);
        // an invalid row is zero-filled: cp.async then reads nothing at src
        const uint8_t* src = p.kv + (valid ? j * p.kv_stride_s : 0) + 16 * part;
        if (p.rows_16b_aligned)
            cp_async_row_share<kChunksPerThread, kLandingAtomColumnBytes>(landing0_shared + buffer * half_tile_bytes(D), src, valid);
        else
            copy_row_share<kChunksPerThread, kLandingAtomColumnBytes>(landing0 + buffer * half_tile_bytes(D) + row_chunk, src, valid);
        cute::cp_async_fence();
    };
    // V of the row's chunks in fp16: columns 16 part + 64 m .. + 15, two 16-byte pieces per chunk
    const uint32_t v16_lo = sw128_byte(row, 16 * part), v16_hi = sw128_byte(row, 16 * part + 8);
    auto convert_v = [&](int buffer) {
        convert_row_v<kLandingAtomColumnBytes, kV16AtomColumnBytes>(landing0 + buffer * half_tile_bytes(D) + row_chunk,
                                                                    v16 + v16_lo, v16 + v16_hi);
    };

    // Half tile c + kBuffers - 1 + kLead is gathered once QK^T of c - 1 + kLead is done (after the
    // conversion of c). The exact kernel gathers into c's buffer as soon as QK^T of c is done
    // (kLead 1), which its two buffers at d_qk 576 need: there the gather of c + 1 had waited for the
    // conversion of c and so for P.V of c - 1 (1.02-1.05x at d_qk 576, 1.00x at 512); dual_fast
    // keeps the later gather (kLead 0; 0.97x at the window rows with kLead 1: PERF-HISTORY.md). One
    // cp.async group per half tile (empty past the last), so that a fixed wait count finds half tile c
    // landed; each thread converts only the chunks it gathered. Every arrival of the consumer is
    // waited for exactly once.
    constexpr int kLead = kFast ? 0 : 1;
    next.open(work);
    int32_t next_j = half_index();
    int n_gathered = 0;
    auto gather_next = [&]() {
        if (next.done(work)) {
            cute::cp_async_fence();
            return;
        }
        const int32_t j = next_j;
        next.advance(work);
        next_j = half_index();
        gather(n_gathered++ % kBuffers, j);
    };
    // Half tile c is announced once it has landed. With three buffers that is an iteration early,
    // before c - 1's conversion (which waits for P.V of c - 2), so that QK^T of c does not wait for
    // it; with two, c has just been gathered then.
    auto announce = [&](int c) {
        fence_for_tensor_cores();
        bar_arrive(kLandingFullBar0 + c % kBuffers, Traits::kThreads);
    };
    for (int i = 0; i < kBuffers - 1 + kLead; ++i) gather_next();
    if constexpr (kBuffers >= 3) {
        if (n_gathered >= 1) {
            cute::cp_async_wait<kBuffers - 2 + kLead>();
            announce(0);
        }
    }
    for (int c = 0; c < n_gathered; ++c) {
        const int buffer = c % kBuffers;
        if constexpr (kBuffers >= 3) {
            // every group up to c + 1's (gathered an iteration ago, or two)
            cute::cp_async_wait<kBuffers - 3 + kLead>();
            if (c + 1 < n_gathered) announce(c + 1);
        } else {
            cute::cp_async_wait<kBuffers - 2 + kLead>();
            announce(c);
        }
        if (c >= 1) bar_sync(kV16EmptyBar, Traits::kThreads);  // P.V of c - 1 has read the fp16 half tile
        if constexpr (kFast) {
            // a thread transposes rows that others gathered: each has waited for its own copies
            bar_sync(kProducersBar, Traits::kProducerThreads);
            transpose_v_half<kHalfSlots>(landing0 + buffer * half_tile_bytes(D), 0, v16, ptid);
        } else {
            convert_v(buffer);  // only the chunks this thread gathered
        }
        fence_for_tensor_cores();
        bar_arrive(kV16FullBar, Traits::kThreads);
        // QK^T of c - 1 + kLead done
        if (c + kLead >= 1) bar_sync(kLandingEmptyBar0 + (c + kLead - 1) % kBuffers, Traits::kThreads);
        gather_next();
    }
    if (n_gathered >= 1) {
        if constexpr (kLead == 0) bar_sync(kLandingEmptyBar0 + (n_gathered - 1) % kBuffers, Traits::kThreads);
        bar_sync(kV16EmptyBar, Traits::kThreads);
    }
}

// kFast: precision "fast" (dual_fast): QK^T's tensor-core sums over several K steps, max_logits
// and lse from the running max, and the next item's Q loaded as soon as the last QK^T has read this
// one's (nothing reads it at the item's end).
template <int D, bool kFast = false>
__device__ void prefill(const SparseMlaParams& p) {
    using namespace cute;
    constexpr int kAcc = kHeadsPerCta * kHalfSlots / kWarpgroupThreads;  // S values of a thread

    extern __shared__ __align__(1024) uint8_t smem[];
    uint8_t* v16 = smem;
    uint8_t* landing0 = smem + landing_smem_offset(kFast);
    uint8_t* q_tile = smem + q_smem_offset(D, kFast);

    const int tid = threadIdx.x;
    const WorkItems work(p, kHeadsPerCta);
    const int64_t n_items = work.n_items;
    const Scales scale(p);

    if (tid >= Traits::kConsumerThreads) {
        produce_half_tiles<D, kFast>(p, work, smem);
        return;
    }

    const ConsumerThread me = enter_consumer<Traits>();
    const int lane = me.lane, tig = me.tig, row0 = me.row0;

    // Q of an item into its swizzled tile (heads past h_q are zero rows), issued for the next item
    // once this one's exact max has read it there (write_item's q_read): 12% faster than issuing it
    // after the last QK^T and reading the exact max's Q rows from global memory (PERF-HISTORY.md, v19)
    // (the tile opaque too: without, the exact kernel's out stores spilled at d_qk 512, 2-10% slower)
    auto load_q = [&](int64_t item) {
        load_q_rows<D, kHeadsPerCta, Traits::kConsumerThreads, true>(p, work, item, q_tile, tid);
    };
    if (blockIdx.x < n_items) load_q(blockIdx.x);

    const uint64_t q_desc = q_descriptor<D>(q_tile, tid);
    const uint64_t k_desc0 = k_descriptor<D, kHalfSlots>(landing0, 0, tid);
    const auto v_b = [&] {
        if constexpr (kFast) return vt_descriptor(v16, tid);
        else return PvOperandB(v16, tid, std::integral_constant<int, D>{}, std::integral_constant<int, kHalfSlots>{});
    }();

    // O of the 64 heads x 512 columns in f16; P scaled by 2^-p_shift (from topk) so that O stays
    // below f16's 65504.
    F16O o;
    // (fast: P's scale follows the row sum instead: SoftmaxRows::softmax_e4m3)
    const float p_shift = kFast ? 0.f : p_shift_for(p.topk);
    // P of the half tile before (its P.V may still read it) and this one: fp16 pairs, or (fast) e4m3
    uint32_t pr[2][8], pa[2][1][4];
    SoftmaxRows rows;

    int cta_half = 0;  // this CTA's half tiles so far, across items: names the landing buffer
    for (int64_t item = blockIdx.x; item < n_items; item += gridDim.x) {
        const auto [t, head0, n_slots, n_tiles, idx_row, more] = work.take(item);
        await_q(kQBar, Traits::kConsumerThreads);
        each_word(o, [](uint32_t& x) { x = 0; });
        rows.reset();

        for (int tile = 0; tile < n_tiles; ++tile) {
            CUTE_UNROLL
            for (int h = 0; h < 2; ++h, ++cta_half) {
                const int buffer = cta_half % landing_buffers(D, kFast);
                // the validity of the half tile's slots, from the indices (lane j: slot 32 h + j)
                const bool lane_valid = work.valid_slot(idx_row, n_slots, static_cast<int64_t>(tile) * kSlotsPerTile + kHalfSlots * h + lane);
                bar_sync(kLandingFullBar0 + buffer, Traits::kThreads);
                float s[kAcc] = {};
                const uint64_t k_desc = k_desc0 + static_cast<uint64_t>(buffer * half_tile_bytes(D) / 16);
                auto pv_before_done = [&] {
                    // the previous half tile's P.V, issued last, is done now: the fp16 half tile is free
                    each_word(o, [](uint32_t& x) { warpgroup_fence_operand(x); });
                    if (tile > 0 || h > 0) bar_arrive(kV16EmptyBar, Traits::kThreads);
                };
                qk_promoted<D, kHalfSlots, 0, kFast ? fast_steps_per_sum(D) : 1>(q_desc, k_desc, s, pv_before_done);
                bar_arrive(kLandingEmptyBar0 + buffer, Traits::kThreads);

                // online softmax, base 2, on the half tile's 32 slots
                const uint32_t valid = __ballot_sync(0xffffffffu, lane_valid);
                if constexpr (kFast) {
                    float alpha[2];
                    follow_ref(o, rows.softmax_e4m3<false>(s, valid, h, tile, tig, scale.logit, alpha), alpha);
                    e4m3_p(s, pa[h]);
                } else {
                    rows.softmax_half(s, valid, h, tile, tig, scale.logit, p_shift, o, pr[h]);
                }

                bar_sync(kV16FullBar, Traits::kThreads);  // V of this half tile
                if constexpr (kFast) {
                    warpgroup_arrive();
                    pv_e4m3(pa[h], v_b, o);
                    warpgroup_commit_batch();
                } else {
                    pv_half(pr[h], v_b, 0, o);
                }
            }
        }
        if constexpr (kFast) {
            // under the last P.V: its QK^T was the last to read Q
            bar_sync(kQBar, Traits::kConsumerThreads);
            if (more) load_q(item + gridDim.x);
        }
        warpgroup_wait<0>();
        each_word(o, [](uint32_t& x) { warpgroup_fence_operand(x); });
        if (n_tiles > 0) bar_arrive(kV16EmptyBar, Traits::kThreads);
        write_item<D, !kFast>(p, work, scale, t, head0, n_slots, idx_row, rows, o, p_shift, row0, tig, q_tile, [&] {
            bar_sync(kQBar, Traits::kConsumerThreads);  // every row of Q read
            if (work.has_next(item)) load_q(item + gridDim.x);
        });
    }
}

}  // namespace sparse_mla::sm90::dual

namespace sparse_mla::sm90::dual_fast {

template <int D>
__device__ void prefill(const SparseMlaParams& p) {
    dual::prefill<D, true>(p);
}

}  // namespace sparse_mla::sm90::dual_fast
