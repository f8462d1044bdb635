// The SM90 FP8 sparse MLA prefill kernel for calls with one block of 64 heads: one CTA per query
// token, the two consumer warpgroups on the same 64 heads, each on one half of every tile's slots.
//
// A producer warpgroup and two consumer warpgroups, meeting on named barriers. Per tile of 64 topk
// slots:
//   1. the producer gathers the e4m3 kv rows (cp.async) into a landing tile, two tiles ahead; invalid
//      slots become zero rows with a -inf logit;
//   2. consumer warpgroup h computes S = Q K^T of half tile h (m64n32k32) by FP8 wgmma straight from
//      the landing tile, promoted per K step (PERF.md);
//   3. meanwhile the producer converts V of half tile h (the first 512 columns) to fp16 into the
//      half of a 128-byte-swizzled [slot][column] tile that warpgroup h's P.V reads MN-major (no
//      transpose), announced to that warpgroup alone; the half is free again once both warpgroups
//      have passed their P.V of the tile (one empty barrier per half, counting both, so that the
//      end of an item's merge orders the producer directly);
//   4. online softmax in base 2 on its 32 slots, its own running max; the slot of each logit rides in
//      its 6 lowest mantissa bits, so the running maximum names its slot. P (fp16, scaled by
//      2^-p_shift) stays in registers as the A of P.V, and O accumulates in f16 registers over all 512
//      columns (wgmma's f16 accumulator rounds to nearest: out within ~2.3e-3 up to wide::kMaxTopk
//      slots per warpgroup);
//   5. at the end the warpgroups merge: each hands the other its row statistics and, through the
//      fp16 tile, the half of O that the other writes out (so the last P.V's halves are freed only
//      after the merge, and an item without tiles hands nothing); the row's max slot is recomputed
//      exactly (fp32 sums of the e4m3 products) and its exact term replaces its own in the sum
//      behind lse.
// The warpgroups never wait for each other inside an item, so one's softmax runs under the other's
// wgmmas. The grid is persistent (one CTA per SM, items taken in turn).
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <math_constants.h>

#include <type_traits>
#include <utility>

#include <cute/atom/mma_traits_sm90_gmma.hpp>
#include <cute/tensor.hpp>

#include "params.h"
#include "sm90/device_helpers.cuh"
#include "sm90/exact_max.cuh"
#include "sm90/f16_o.cuh"
#include "sm90/split/config.h"
#include "sm90/work.cuh"

namespace sparse_mla::sm90::split {

// Named barriers (0 is __syncthreads). A full/empty pair orders a landing buffer between the
// producer, which arrives on "full" and waits on "empty", and the consumers, which do the opposite.
enum Barrier : int {
    kConsumersBar = 1,
    kLandingFullBar0,  // + 2 landing buffer + consumer warpgroup: each warpgroup waits for its own
    kLandingEmptyBar0 = kLandingFullBar0 + kLandingBuffers * Traits::kConsumerWarpgroups,  // + landing buffer
    kV16FullBar0 = kLandingEmptyBar0 + kLandingBuffers,  // + half tile = consumer warpgroup
    kV16EmptyBar0 = kV16FullBar0 + Traits::kConsumerWarpgroups,
    kProducersBar = kV16EmptyBar0 + Traits::kConsumerWarpgroups,
};
static_assert(kProducersBar < 16, "sm_90 has 16 named barriers");
constexpr int kPairThreads = Traits::kProducerThreads + kWarpgroupThreads;  // the producer and one consumer warpgroup

template <int D>
__device__ void prefill(const SparseMlaParams& p) {
    using namespace cute;
    constexpr int kHalfSlots = kSlotsPerTile / 2;
    constexpr int kAcc = kHeadsPerCta * kHalfSlots / kWarpgroupThreads;  // S values of a thread
    static_assert(Traits::smem_bytes(D) <= 227 * 1024, "shared memory of one SM90 CTA");

    extern __shared__ __align__(1024) uint8_t smem[];
    uint8_t* v16 = smem;  // the fp16 tile first (config.h)
    auto landing = [&](int buffer) { return smem + landing_smem_offset(D) + buffer * e4m3_tile_bytes(D); };
    uint8_t* q_tile = smem + q_smem_offset(D);
    auto stats = reinterpret_cast<RowStats (*)[kHeadsPerCta]>(smem + stats_smem_offset(D));

    const int tid = threadIdx.x;
    const WorkItems work(p, kHeadsPerCta);
    const int64_t n_items = work.n_items;

    const Scales scale(p);

    if (tid >= Traits::kConsumerThreads) {
        produce<Traits, D, kLandingBuffers>(
            p, work, landing(0), v16, nullptr, kLandingEmptyBar0, kProducersBar,
            [](int buffer) {
                for (int w = 0; w < Traits::kConsumerWarpgroups; ++w) bar_arrive(kLandingFullBar0 + Traits::kConsumerWarpgroups * buffer + w, kPairThreads);
            },
            [](int, int half) { bar_sync(kV16EmptyBar0 + half, Traits::kThreads); },
            [](int, int half) { bar_arrive(kV16FullBar0 + half, kPairThreads); });
        return;
    }

    const ConsumerThread me = enter_consumer<Traits>();
    const int wg = me.wg, wg_tid = me.wg_tid, lane = me.lane, tig = me.tig, row0 = me.row0;

    // Q of an item into its swizzled tile; heads past h_q are zero rows. Issued for the next item
    // once both warpgroups' last QK^T is done, so that the merge hides it.
    auto load_q = [&](int64_t item) { load_q_rows<D, kHeadsPerCta, Traits::kConsumerThreads>(p, work, item, q_tile, tid); };
    if (blockIdx.x < n_items) load_q(blockIdx.x);

    const uint64_t q_desc = q_descriptor<D>(q_tile, wg_tid);
    // this warpgroup's half tile of landing buffer 0
    const uint64_t k_desc0 = k_descriptor<D>(landing(0), wg, wg_tid);
    const PvOperandB v_b(v16, wg_tid, std::integral_constant<int, D>{});

    // O of the 64 heads x 512 columns over this warpgroup's slots, in f16; P scaled by 2^-p_shift
    // (from the slots a warpgroup sums) so that O stays below f16's 65504.
    F16O o;
    const float p_shift = p_shift_for(kHalfSlots * ((p.topk + kSlotsPerTile - 1) / kSlotsPerTile));
    uint32_t pr[8];
    SoftmaxRows rows;

    int cta_tile = 0;
    bool pending_empty = false;
    for (int64_t item = blockIdx.x; item < n_items; item += gridDim.x) {
        const WorkItems::Taken it = work.take(item);  // (not a structured binding: merge captures it)
        // Q landed; the previous item's merge has read the fp16 tile and the statistics
        await_q(kConsumersBar, Traits::kConsumerThreads);
        // the previous P.V's half of the fp16 tile is free only now, after that item's merge; an item
        // without tiles has a merge too, and defers it further
        if (pending_empty && it.n_tiles > 0) {
            for (int h = 0; h < 2; ++h) bar_arrive(kV16EmptyBar0 + h, Traits::kThreads);
            pending_empty = false;
        }
        each_word(o, [](uint32_t& x) { x = 0; });
        rows.reset();

        for (int tile = 0; tile < it.n_tiles; ++tile, ++cta_tile) {
            const int buffer = cta_tile % kLandingBuffers;
            // the validity of its half tile's slots, from the indices (lane j: slot 32 wg + j), loaded
            // now and used after the QK^T (racecheck does not follow words handed over in shared
            // memory through this kernel's barriers: PERF-HISTORY.md, v17)
            const bool lane_valid =
                work.valid_slot(it.idx_row, it.n_slots, static_cast<int64_t>(tile) * kSlotsPerTile + kHalfSlots * wg + lane);
            bar_sync(kLandingFullBar0 + Traits::kConsumerWarpgroups * buffer + wg, kPairThreads);
            float s[kAcc] = {};
            qk_promoted<D>(q_desc, k_desc0 + static_cast<uint64_t>(buffer * e4m3_tile_bytes(D) / 16), s, [&] {
                each_word(o, [](uint32_t& x) { warpgroup_fence_operand(x); });
                if (tile > 0) for (int h = 0; h < 2; ++h) bar_arrive(kV16EmptyBar0 + h, Traits::kThreads);
            });
            bar_arrive(kLandingEmptyBar0 + buffer, Traits::kThreads);

            // online softmax, base 2, on this warpgroup's 32 slots
            rows.softmax_half(s, __ballot_sync(0xffffffffu, lane_valid), wg, tile, tig, scale.logit, p_shift, o, pr);

            bar_sync(kV16FullBar0 + wg, kPairThreads);  // its half of V converted
            pv_half(pr, v_b, wg, o);
        }
        warpgroup_wait<0>();
        each_word(o, [](uint32_t& x) { warpgroup_fence_operand(x); });
        pending_empty = pending_empty || it.n_tiles > 0;

        // The merge. Each warpgroup posts its rows' statistics over its slots; both then take the
        // same combined reference, sum and max slot for every row, bit for bit (fmaxf and + are
        // symmetric).
        CUTE_UNROLL
        for (int r = 0; r < 2; ++r) {
            const float sum = quad_sum(rows.sum[r]);  // in units of 2^-p_shift
            if (tig == 0) stats[wg][row0 + 8 * r] = RowStats{rows.max[r], rows.ref[r], sum, rows.max_tile[r]};
        }
        bar_sync(kConsumersBar, Traits::kConsumerThreads);  // statistics posted; both warpgroups' QK^T and P.V done
        if (it.more) load_q(item + gridDim.x);
        float ref[2], own_weight[2], other_weight[2], total[2], best_max[2];
        int best_tile[2];
        CUTE_UNROLL
        for (int r = 0; r < 2; ++r) {
            const RowStats own = stats[wg][row0 + 8 * r], other = stats[wg ^ 1][row0 + 8 * r];
            ref[r] = fmaxf(own.ref, other.ref);  // -inf when neither warpgroup has a valid slot
            own_weight[r] = own.ref == -CUDART_INF_F ? 0.f : exp2f(own.ref - ref[r]);
            other_weight[r] = other.ref == -CUDART_INF_F ? 0.f : exp2f(other.ref - ref[r]);
            total[r] = own_weight[r] * own.sum + other_weight[r] * other.sum;
            const bool own_best = own.max > other.max;
            best_max[r] = own_best ? own.max : other.max;
            best_tile[r] = own_best ? own.tile : other.tile;
        }
        // max_logits and lse: warpgroup wg takes row row0 + 8 wg. The index of its max slot loads now,
        // under the output stores.
        const int64_t h_own = it.head0 + row0 + 8 * wg;
        // (selects: a register array indexed at run time would go to memory)
        const float max_own = wg ? best_max[1] : best_max[0];
        const bool own_empty = max_own == -CUDART_INF_F;
        int32_t j_max = -1;
        if (h_own < p.h_q && !own_empty) j_max = max_index(max_own, wg ? best_tile[1] : best_tile[0], it.n_slots, it.idx_row);

        // O: warpgroup wg writes out columns 256 wg .. 256 wg + 255 and hands the other half of its
        // O to the other warpgroup, through the fp16 tile in this thread's order (16-byte words,
        // consecutive threads consecutive words: no bank conflicts). Its half is a compile-time
        // index (a run-time one would put O in memory).
        uint4* handed = reinterpret_cast<uint4*>(v16);
        constexpr int kWords = 64 / 4;  // 16-byte words of one 256-column half of a thread's O
        auto merge = [&](auto half) {
            constexpr int n = decltype(half)::value;
            // (not for an item without tiles: its O is zero, and the producer may be converting the
            // next item's first tile into the fp16 tile already)
            CUTE_UNROLL
            for (int k = 0; k < kWords; ++k)
                if (it.n_tiles > 0) handed[((n ^ 1) * kWords + k) * kWarpgroupThreads + wg_tid] =
                    make_uint4(o[n ^ 1][4 * k], o[n ^ 1][4 * k + 1], o[n ^ 1][4 * k + 2], o[n ^ 1][4 * k + 3]);
            bar_sync(kConsumersBar, Traits::kConsumerThreads);  // the halves handed over
            uint32_t theirs[64];
            CUTE_UNROLL
            for (int k = 0; k < kWords; ++k) {
                const uint4 w = it.n_tiles > 0 ? handed[(n * kWords + k) * kWarpgroupThreads + wg_tid] : make_uint4(0, 0, 0, 0);
                theirs[4 * k] = w.x, theirs[4 * k + 1] = w.y, theirs[4 * k + 2] = w.z, theirs[4 * k + 3] = w.w;
            }
            CUTE_UNROLL
            for (int r = 0; r < 2; ++r) {
                const int64_t h = it.head0 + row0 + 8 * r;
                const bool real = h < p.h_q;
                float denom = total[r];
                if (p.attn_sink && real) denom += exp2f(p.attn_sink[h * p.attn_sink_stride] * kLog2e - ref[r] - p_shift);
                const float o_scale = best_max[r] == -CUDART_INF_F ? 0.f : scale.kv / denom;
                const float own_scale = own_weight[r] * o_scale, other_scale = other_weight[r] * o_scale;
                uint16_t* out = p.out + it.t * p.out_stride_s + (real ? h : 0) * p.out_stride_h;
                store_row<n, n + 1>(out, r, tig, p.out_rows_16b_aligned, real, [&](int, int j) {
                    const float2 x = __half22float2(*reinterpret_cast<const __half2*>(&o[n][j]));
                    const float2 y = __half22float2(*reinterpret_cast<const __half2*>(&theirs[j]));
                    return bf16x2(x.x * own_scale + y.x * other_scale, x.y * own_scale + y.y * other_scale);
                });
            }
        };
        if (wg == 0) merge(std::integral_constant<int, 0>{});
        else merge(std::integral_constant<int, 1>{});

        // The exact logit of the max slot, its Q row from global memory (the Q tile may hold the
        // next item's).
        const float exact_max = exact_logit_from_global<D>(p, work, scale, it.t, h_own, j_max, tig);
        if (h_own < p.h_q && tig == 0)
            write_max_lse(p, it.t, h_own, max_own, (wg ? ref[1] : ref[0]) + p_shift, wg ? total[1] : total[0], exact_max, own_empty);
    }
    bar_sync(kConsumersBar, Traits::kConsumerThreads);
    if (pending_empty) for (int h = 0; h < 2; ++h) bar_arrive(kV16EmptyBar0 + h, Traits::kThreads);
}

}  // namespace sparse_mla::sm90::split
