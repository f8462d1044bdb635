// The SM90 FP8 sparse MLA prefill kernel under precision "fast" for calls with more than 64 heads:
// one CTA per query token and 128 heads, one template for every QK head dim.
//
// A producer warpgroup and two consumer warpgroups, each of 64 heads and all of d_v, as in the wide
// kernel; what precision "fast" allows changes the rest. Per tile of 64 topk slots:
//   1. the producer gathers the e4m3 kv rows (cp.async) into a landing tile, one tile ahead, and
//      says so on the tile's mbarrier; invalid slots become zero rows, and the consumers take each
//      slot's validity from the indices;
//   2. each consumer warpgroup computes S = Q K^T of the whole tile as two chains of FP8 wgmmas
//      (m64n64k32), each summed on the tensor cores over half of d_qk's K steps and the two added in
//      fp32 (one chain over all of d_qk missed fast's lse bound at large logits: PERF.md);
//   3. the producer transposes the tile's V into e4m3 V^T (two VtTiles, slots in P's register
//      order) in one of two V^T tiles, so that it works on tile i while P.V reads tile i - 1;
//   4. online softmax in base 2 (SoftmaxRows::softmax_e4m3: P scaled by a whole power of two that
//      follows the row sum), P e4m3 in registers as the A of P.V: four m64n256k32 FP8 wgmmas into
//      an f16 O of 64 heads x 512 columns;
//   5. at an item's end, out, then max_logits recomputed exactly for the slot the running max names
//      and lse with that exact term (write_item's exact max: a chain's max alone missed 1e-2).
// The two consumer warpgroups take the tensor cores in turns (FlashAttention-3's ping-pong): in its
// turn a warpgroup issues QK^T of tile i and P.V of tile i - 1, then lets the other issue its own,
// and its softmax of tile i runs under the other's wgmmas. Named barriers pass the turn. (A model of
// the synchronization, checked under random schedules on the CPU: ci/models/wide_fast_sync.py.)
// The grid is persistent (one CTA per SM, items taken in turn): the producer's stream of tiles runs
// on from one item into the next, and each warpgroup loads its next Q under its exact max's sums.
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
#include "sm90/wide_fast/config.h"
#include "sm90/work.cuh"

namespace sparse_mla::sm90::wide_fast {

// Named barriers (0 is __syncthreads). The consumers arrive on an "empty" barrier once their wgmmas
// have read a buffer, and the producer waits on it; the "full" side is on mbarriers (config.h).
enum Barrier : int {
    kLandingEmptyBar0 = 1,                           // + landing buffer
    kVtEmptyBar0 = kLandingEmptyBar0 + kLandingBuffers,  // + V^T buffer
    kProducersBar = kVtEmptyBar0 + kVtBuffers,
    kQBar0,                                 // + consumer warpgroup: its Q landed, or was read
    kTurnBar0 = kQBar0 + kConsumerWarpgroups,  // + consumer warpgroup: its turn on the tensor cores
};
static_assert(kTurnBar0 + kConsumerWarpgroups <= 16, "sm_90 has 16 named barriers");
constexpr int kTurnThreads = kConsumerWarpgroups * kWarpgroupThreads;

using MmaQK64 = cute::SM90_64x64x32_F32E4M3E4M3_SS_TN<>;

// S = Q K^T of 64 heads x a whole tile of 64 slots as kChains wgmma chains, each over its part of
// d_qk's K steps (the tensor cores sum each chain; the chains are added in fp32 after the wait: the
// accuracy of precision "fast"), into the caller's commit group.
constexpr int kChains = 2;
template <int D>
__device__ inline void qk_tile(uint64_t q_desc, uint64_t k_desc, float (&s)[kChains][32]) {
    constexpr int kSteps = D / kKStep, kStepsPerChain = (kSteps + kChains - 1) / kChains;
    CUTE_UNROLL
    for (int c = 0; c < kChains; ++c) {
        CUTE_UNROLL
        for (int i = 0; i < 32; ++i) cute::warpgroup_fence_operand(s[c][i]);
    }
    CUTE_UNROLL
    for (int k = 0; k < kSteps; ++k)
        wgmma_ss<MmaQK64>(at_k_step<D, kHeadsPerWg>(q_desc, k), at_k_step<D, kSlotsPerTile>(k_desc, k), s[k / kStepsPerChain],
                          k % kStepsPerChain == 0 ? cute::GMMA::ScaleOut::Zero : cute::GMMA::ScaleOut::One,
                          std::make_index_sequence<32>{});
}

template <int D>
__device__ void prefill(const SparseMlaParams& p) {
    using namespace cute;

    extern __shared__ __align__(1024) uint8_t smem[];
    uint8_t* vt = smem;  // the V^T tiles first (config.h)
    auto landing = [&](int buffer) { return smem + landing_smem_offset(D) + buffer * e4m3_tile_bytes(D); };
    uint8_t* q_tile = smem + q_smem_offset(D);
    uint64_t* landing_full = reinterpret_cast<uint64_t*>(smem + bars_smem_offset(D));
    uint64_t* vt_full = landing_full + kLandingBuffers;

    const int tid = threadIdx.x;
    const WorkItems work(p, kHeadsPerCta);
    const int64_t n_items = work.n_items;
    const Scales scale(p);

    if (tid == 0)
        for (int b = 0; b < kFullBars; ++b) mbar_init(landing_full + b, Traits::kProducerThreads);
    __syncthreads();

    if (tid >= Traits::kConsumerThreads) {
        produce<Traits, D, kLandingBuffers, true, kVtBuffers>(
            p, work, landing(0), vt, nullptr, kLandingEmptyBar0, kProducersBar,
            [&](int buffer) { mbar_arrive(landing_full + buffer); },
            [](int tile, int half) { if (half == 0) bar_sync(kVtEmptyBar0 + tile % kVtBuffers, Traits::kThreads); },
            [&](int tile, int half) { if (half == 1) mbar_arrive(vt_full + tile % kVtBuffers); });
        return;
    }

    const ConsumerThread me = enter_consumer<Traits>();
    const int wg = me.wg, wg_tid = me.wg_tid, lane = me.lane, tig = me.tig, row0 = me.row0;
    uint8_t* my_q = q_tile + wg * kHeadsPerWg * D;

    // Q of this warpgroup's heads of an item into its swizzled tile; heads past h_q are zero rows.
    auto load_q = [&](int64_t item) {
        load_q_rows<D, kHeadsPerWg, kWarpgroupThreads>(p, work, item, my_q, wg_tid, wg * kHeadsPerWg);
    };
    if (blockIdx.x < n_items) load_q(blockIdx.x);

    const uint64_t q_desc = q_descriptor<D>(my_q, wg_tid);
    const uint64_t k_desc0 = static_cast<uint64_t>(
        make_tiled_mma(MmaQK64{}).get_thread_slice(wg_tid).partition_fragment_B(make_tensor(
            make_smem_ptr(reinterpret_cast<float_e4m3_t*>(landing(0))), E4m3Tile<kSlotsPerTile, D>{}))(0, 0, 0));
    const uint64_t vt_desc0 = vt_descriptor(vt, wg_tid);

    // The turns: warpgroup 0 takes the first; each turn ends by passing it to the other.
    auto take_turn = [&] { bar_sync(kTurnBar0 + wg, kTurnThreads); };
    auto pass_turn = [&] { bar_arrive(kTurnBar0 + (wg ^ 1), kTurnThreads); };
    if (wg == 1) pass_turn();

    F16O o;
    float s[kChains][32];
    uint32_t pa[2][4];  // P of the tile before, for its P.V in this tile's turn
    SoftmaxRows rows;

    int cta_tile = 0;  // this CTA's tiles so far, across items: names the buffers and their phases
    auto phase = [](int tile, int buffers) { return static_cast<uint32_t>(tile / buffers) & 1; };
    for (int64_t item = blockIdx.x; item < n_items; item += gridDim.x) {
        // (not a structured binding: tile_turn captures it)
        const WorkItems::Taken it = work.take(item, wg * kHeadsPerWg);
        const int64_t n_slots = it.n_slots;
        const int32_t* idx_row = it.idx_row;
        await_q(kQBar0 + wg, kWarpgroupThreads);  // this warpgroup's Q
        each_word(o, [](uint32_t& x) { x = 0; });
        rows.reset();

        // Tile `tile`'s turn: its QK^T and (with_pv) P.V of the tile before; then its softmax. The
        // first tile is a turn of its own (no P.V before it): a P.V issued under a runtime condition
        // made ptxas serialize every wgmma (C7514), or wait for it with QK^T.
        auto tile_turn = [&](int tile, auto with_pv) {
            const int buffer = cta_tile % kLandingBuffers, prev_vt = (cta_tile + kVtBuffers - 1) % kVtBuffers;
            // the validity of the tile's slots, from the indices (lane j: slots j and 32 + j)
            const int64_t slot0 = static_cast<int64_t>(tile) * kSlotsPerTile + lane;
            const bool valid_lo = work.valid_slot(idx_row, n_slots, slot0);
            const bool valid_hi = work.valid_slot(idx_row, n_slots, slot0 + kSlotsPerTile / 2);
            mbar_wait(landing_full + buffer, phase(cta_tile, kLandingBuffers));
            if constexpr (with_pv) mbar_wait(vt_full + prev_vt, phase(cta_tile - 1, kVtBuffers));

            take_turn();
            warpgroup_arrive();
            qk_tile<D>(q_desc, desc_plus(k_desc0, buffer * e4m3_tile_bytes(D)), s);
            warpgroup_commit_batch();
            if constexpr (with_pv) {
                warpgroup_arrive();
                pv_e4m3(pa, desc_plus(vt_desc0, prev_vt * kVtBufferBytes), o);
                warpgroup_commit_batch();
            }
            pass_turn();
            warpgroup_wait<with_pv ? 1 : 0>();
            CUTE_UNROLL
            for (int i = 0; i < 32; ++i) {
                CUTE_UNROLL
                for (int c = 0; c < kChains; ++c) warpgroup_fence_operand(s[c][i]);
                CUTE_UNROLL
                for (int c = 1; c < kChains; ++c) s[0][i] += s[c][i];
            }
            bar_arrive(kLandingEmptyBar0 + buffer, Traits::kThreads);  // QK^T has read the landing tile

            // online softmax, base 2, on the tile's 64 slots, under the other warpgroup's turn
            const uint64_t valid = __ballot_sync(0xffffffffu, valid_lo) |
                                   static_cast<uint64_t>(__ballot_sync(0xffffffffu, valid_hi)) << 32;
            float alpha[2];
            const bool moved = rows.softmax_e4m3(s[0], valid, 0, tile, tig, scale.logit, alpha);

            if constexpr (with_pv) {
                warpgroup_wait<0>();  // P.V of the tile before: O and pa are free
                each_word(o, [](uint32_t& x) { warpgroup_fence_operand(x); });
                bar_arrive(kVtEmptyBar0 + prev_vt, Traits::kThreads);
            }
            follow_ref(o, moved, alpha);
            e4m3_p(s[0], pa);
            ++cta_tile;
        };
        if (it.n_tiles > 0) tile_turn(0, std::false_type{});
        for (int tile = 1; tile < it.n_tiles; ++tile) tile_turn(tile, std::true_type{});
        if (it.n_tiles > 0) {  // the last tile's P.V, a turn of its own
            const int last_vt = (cta_tile + kVtBuffers - 1) % kVtBuffers;
            mbar_wait(vt_full + last_vt, phase(cta_tile - 1, kVtBuffers));
            take_turn();
            warpgroup_arrive();
            pv_e4m3(pa, desc_plus(vt_desc0, last_vt * kVtBufferBytes), o);
            warpgroup_commit_batch();
            pass_turn();
            warpgroup_wait<0>();
            each_word(o, [](uint32_t& x) { warpgroup_fence_operand(x); });
            bar_arrive(kVtEmptyBar0 + last_vt, Traits::kThreads);
        }
        write_item<D, true>(p, work, scale, it.t, it.head0, n_slots, idx_row, rows, o, 0.f, row0, tig, my_q, [&] {
            bar_sync(kQBar0 + wg, kWarpgroupThreads);  // every row of Q read
            if (it.more) load_q(item + gridDim.x);
        });
    }
    // warpgroup 1 passed the turn once more than warpgroup 0 took it
    if (wg == 0) take_turn();
}

}  // namespace sparse_mla::sm90::wide_fast
