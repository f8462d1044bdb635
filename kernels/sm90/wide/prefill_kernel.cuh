// The SM90 FP8 sparse MLA prefill kernel for calls with more than 64 heads: one CTA per query token
// and 128 heads, one template for every QK head dim.
//
// A producer warpgroup and two consumer warpgroups, meeting on named barriers. Each consumer
// warpgroup owns 64 heads and all of d_v, so the two share only the gathered tiles: no row maxima
// or P pass between them. Per tile of 64 topk slots:
//   1. the producer gathers the e4m3 kv rows (cp.async) into a landing tile, one tile ahead; invalid
//      slots become zero rows with a -inf logit;
//   2. each consumer warpgroup computes S = Q K^T by FP8 wgmma straight from the landing tile, a
//      half tile (m64n32k32) at a time. The tensor cores keep only ~14 bits of a sum, so every K
//      step starts from zero and is added into fp32 registers (PERF.md);
//   3. meanwhile the producer converts V (the first 512 columns) to fp16, into a 128-byte-swizzled
//      [slot][column] tile that P.V reads MN-major (no transpose), one half tile at a time: each
//      half is announced, waited for and freed on its own, so that converting the next tile's first
//      half overlaps this tile's second P.V;
//   4. online softmax in base 2 on the half tile; the slot of each logit rides in its 6 lowest
//      mantissa bits, so the running maximum names its slot. P (fp16, scaled by 2^-p_shift) stays in
//      registers as the A of P.V, and O accumulates in f16 registers over all 512 columns: wgmma's f16
//      accumulator rounds to nearest, which keeps out within ~2.3e-3 up to wide::kMaxTopk slots.
//      P.V is issued in pieces inside the next half's QK^T, between its K steps, where it fills the
//      tensor cores that the K steps' promotion leaves idle;
//   5. at the end, max_logits is recomputed exactly (fp32 sums of the e4m3 products) for the slot
//      that the running maximum names, and that exact term replaces its own in the sum behind lse.
// The grid is persistent (one CTA per SM, items taken in turn): the producer's stream of tiles runs
// on from one item into the next, and the next item's Q loads once this one's exact max has read its
// Q rows.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <math_constants.h>

#include <utility>

#include <cute/atom/mma_traits_sm90_gmma.hpp>
#include <cute/tensor.hpp>

#include "params.h"
#include "sm90/device_helpers.cuh"
#include "sm90/f16_o.cuh"
#include "sm90/work.cuh"
#include "sm90/wide/config.h"

namespace sparse_mla::sm90::wide {

// Named barriers (0 is __syncthreads). A full/empty pair orders a buffer between the producer, which
// arrives on "full" and waits on "empty", and the consumers, which do the opposite.
enum Barrier : int {
    kLandingFullBar0 = 1,  // + 2 landing buffer + consumer warpgroup: each warpgroup waits for its own
    kLandingEmptyBar0 = kLandingFullBar0 + kLandingBuffers * kConsumerWarpgroups,  // + landing buffer
    kV16FullBar0 = kLandingEmptyBar0 + kLandingBuffers,  // + 2 half tile + consumer warpgroup
    kV16EmptyBar0 = kV16FullBar0 + 2 * kConsumerWarpgroups,  // + half tile
    kProducersBar = kV16EmptyBar0 + 2,
    kQBar0,  // + consumer warpgroup: its Q landed
};
static_assert(kQBar0 + kConsumerWarpgroups <= 16, "sm_90 has 16 named barriers");
constexpr int kPairThreads = Traits::kProducerThreads + kWarpgroupThreads;  // the producer and one consumer warpgroup

template <int D>
__device__ void prefill(const SparseMlaParams& p) {
    using namespace cute;
    constexpr int kHalfSlots = kSlotsPerTile / 2;
    constexpr int kAcc = kHeadsPerWg * kHalfSlots / kWarpgroupThreads;  // S values of a thread
    static_assert(Traits::smem_bytes(D) <= 227 * 1024, "shared memory of one SM90 CTA");

    extern __shared__ __align__(1024) uint8_t smem[];
    uint8_t* v16 = smem;  // the fp16 tile first (config.h)
    auto landing = [&](int buffer) { return smem + landing_smem_offset(D) + buffer * e4m3_tile_bytes(D); };
    uint8_t* q_tile = smem + q_smem_offset(D);
    // the validity of a landing tile's slots, a bit each: one word per consumer warpgroup's 32 slots
    auto slot_valid = reinterpret_cast<uint32_t (*)[kConsumerWarpgroups]>(smem + valid_smem_offset(D));

    const int tid = threadIdx.x;
    const WorkItems work(p, kHeadsPerCta);
    const int64_t n_items = work.n_items;

    const Scales scale(p);

    if (tid >= Traits::kConsumerThreads) {
        // each consumer warpgroup waits for its own barriers; P.V reads the fp16 tile a half at a time
        produce<Traits, D, kLandingBuffers>(
            p, work, landing(0), v16, slot_valid, kLandingEmptyBar0, kProducersBar,
            [](int buffer) {
                for (int w = 0; w < kConsumerWarpgroups; ++w) bar_arrive(kLandingFullBar0 + kConsumerWarpgroups * buffer + w, kPairThreads);
            },
            [](int, int half) { bar_sync(kV16EmptyBar0 + half, Traits::kThreads); },
            [](int, int half) {
                for (int w = 0; w < kConsumerWarpgroups; ++w) bar_arrive(kV16FullBar0 + kConsumerWarpgroups * half + w, kPairThreads);
            });
        return;
    }

    const ConsumerThread me = enter_consumer<Traits>();
    const int wg = me.wg, wg_tid = me.wg_tid, tig = me.tig, row0 = me.row0;

    // Q of this warpgroup's heads of an item into its swizzled tile; heads past h_q are zero rows.
    // Issued for the next item once this warpgroup's exact max has read its Q rows from the tile
    // (3% faster at topk 1024 than loading them from global memory, PERF-HISTORY.md v20; issued inside the
    // tile loop it made ptxas spill there: 6% slower); the warpgroups share nothing else of an item,
    // so neither waits for the other's epilogue.
    auto load_q = [&](int64_t item) {
        load_q_rows<D, kHeadsPerWg, kWarpgroupThreads>(p, work, item, q_tile + wg * kHeadsPerWg * D, wg_tid, wg * kHeadsPerWg);
    };
    if (blockIdx.x < n_items) load_q(blockIdx.x);

    const uint64_t q_desc = q_descriptor<D>(q_tile + wg * kHeadsPerWg * D, wg_tid);
    uint64_t k_desc0[2];  // each half tile of landing buffer 0
    CUTE_UNROLL
    for (int h = 0; h < 2; ++h)
        k_desc0[h] = k_descriptor<D>(landing(0), h, wg_tid);
    const PvOperandB v_b(v16, wg_tid, std::integral_constant<int, D>{});

    // O of this warpgroup's 64 heads x 512 columns in f16; P scaled by 2^-p_shift (from topk) so that
    // O stays below f16's 65504.
    F16O o;
    const float p_shift = p_shift_for(p.topk);
    uint32_t pr[2][8];
    SoftmaxRows rows;

    int cta_tile = 0;
    for (int64_t item = blockIdx.x; item < n_items; item += gridDim.x) {
        const auto [t, head0, n_slots, n_tiles, idx_row, more] = work.take(item, wg * kHeadsPerWg);
        await_q(kQBar0 + wg, kWarpgroupThreads);  // this warpgroup's Q
        each_word(o, [](uint32_t& x) { x = 0; });
        rows.reset();

        for (int tile = 0; tile < n_tiles; ++tile, ++cta_tile) {
            const int buffer = cta_tile % kLandingBuffers;
            bar_sync(kLandingFullBar0 + kConsumerWarpgroups * buffer + wg, kPairThreads);
            CUTE_UNROLL
            for (int h = 0; h < 2; ++h) {
                float s[kAcc] = {};
                // the previous half's P.V rides in this QK^T's K steps (6-9% faster than issuing it
                // whole after the softmax: PERF-HISTORY.md, v22)
                const bool pv_before = h == 1 || tile > 0;
                qk_promoted<D, kSlotsPerTile, kPvPieces>(
                    q_desc, k_desc0[h] + static_cast<uint64_t>(buffer * e4m3_tile_bytes(D) / 16), s,
                    [&] {
                        // that P.V is done now
                        each_word(o, [](uint32_t& x) { warpgroup_fence_operand(x); });
                        // its half of the fp16 tile is free: half 0 (this tile's) under the second
                        // half's QK^T, half 1 (the previous tile's) under the next tile's first
                        if (pv_before) bar_arrive(kV16EmptyBar0 + (h ^ 1), Traits::kThreads);
                    },
                    [&](int i) {
                        if (pv_before) pv_piece(pr[h ^ 1], v_b, h ^ 1, i, o);
                    });
                if (h == 1) bar_arrive(kLandingEmptyBar0 + buffer, Traits::kThreads);

                // online softmax, base 2, on this half's 32 slots
                rows.softmax_half(s, slot_valid[buffer][h], h, tile, tig, scale.logit, p_shift, o, pr[h]);

                bar_sync(kV16FullBar0 + kConsumerWarpgroups * h + wg, kPairThreads);  // V of this half tile
            }
        }
        if (n_tiles > 0) pv_half(pr[1], v_b, 1, o);  // the last half's P.V has no QK^T after it
        warpgroup_wait<0>();
        each_word(o, [](uint32_t& x) { warpgroup_fence_operand(x); });
        if (n_tiles > 0) bar_arrive(kV16EmptyBar0 + 1, Traits::kThreads);
        auto next_q = [&] {
            bar_sync(kQBar0 + wg, kWarpgroupThreads);  // every row of Q read
            if (work.has_next(item)) load_q(item + gridDim.x);
        };
        // the next Q under the exact max's sums up to d_qk 512; at 576 ptxas then spills P.V's
        // descriptors into the tile loop (0.989-0.997x on A, B, C and V3.2 DP: PERF-HISTORY.md,
        // qregs), so there the sums read the Q tile and the next Q follows them
        uint8_t* my_q = q_tile + wg * kHeadsPerWg * D;
        if constexpr (D <= 512) {
            write_item<D>(p, work, scale, t, head0, n_slots, idx_row, rows, o, p_shift, row0, tig, my_q, next_q);
        } else {
            write_item<D>(p, work, scale, t, head0, n_slots, idx_row, rows, o, p_shift, row0, tig, my_q);
            next_q();
        }
    }
}

}  // namespace sparse_mla::sm90::wide
