// The SM90 FP8 sparse MLA prefill kernel for 64 heads per CTA with O in fp32, one template for every
// QK head dim: the registry's last entry, it takes every call that no kernel before it takes
// (kernels/registry.h; today the calls with topk above split::kMaxTopk (h_q <= 64) or above
// wide::kMaxTopk (h_q > 64), where an f16 O would miss the contract).
//
// One CTA computes one query token for 64 heads: a producer warpgroup and two consumer warpgroups,
// meeting on named barriers. Per tile of 64 topk slots:
//   1. the producer gathers the e4m3 kv rows (cp.async) into a landing tile, two tiles ahead; invalid
//      slots become zero rows with a -inf logit;
//   2. S = Q K^T by FP8 wgmma straight from the landing tile: each consumer warpgroup computes its 32
//      slots, m64n32k32. The tensor cores keep only ~14 bits of a sum, so every K step starts from
//      zero and is added into fp32 registers (two steps per sum already miss the lse bound at large
//      logits, PERF.md);
//   3. meanwhile the producer converts V (the first 512 columns) to fp16, into a 128-byte-swizzled
//      [slot][column] tile that P.V reads MN-major: no transpose. P in fp16 keeps out within ~2e-3;
//   4. online softmax in base 2 on each warpgroup's 32 slots, the row maxima exchanged; the slot of
//      each logit rides in its 6 lowest mantissa bits, so the running maximum names its slot. P goes
//      into the fp16 tile's columns past d_v, and each warpgroup multiplies all 64 slots by its half
//      of d_v, a wgmma waited for only under the next tile's first K steps;
//   5. at the end, max_logits is recomputed exactly (fp32 sums of the e4m3 products) for the slot
//      that the running maximum names, and that exact term replaces its own in the sum behind lse.
// The grid is persistent (one CTA per SM, items taken in turn): the producer's stream of tiles runs
// on from one item into the next, and the next item's Q loads while this one's epilogue runs.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <math_constants.h>

#include <utility>

#include <cute/arch/copy_sm80.hpp>
#include <cute/atom/mma_traits_sm90_gmma.hpp>
#include <cute/tensor.hpp>

#include "params.h"
#include "sm90/config.h"
#include "sm90/device_helpers.cuh"
#include "sm90/exact_max.cuh"
#include "sm90/fallback/config.h"
#include "sm90/work.cuh"

namespace sparse_mla::sm90::fallback {

// P of a tile, [head][slot], K-major A of P.V: the fp16 tile's last atom column, kPOffset elements in.
using P16Tile = decltype(cute::tile_to_shape(cute::GMMA::Layout_K_SW128_Atom<cute::half_t>{},
                                             cute::Shape<cute::Int<kHeadsPerCta>, cute::Int<kSlotsPerTile>>{}));
constexpr int kPOffset = kDv * kSlotsPerTile;
static_assert(kHeadsPerCta == kSlotsPerTile, "P fills an atom column");

using MmaPV = decltype(cute::make_tiled_mma(
    cute::SM90_64x256x16_F32F16F16_SS<cute::GMMA::Major::K, cute::GMMA::Major::MN>{}));

// Named barriers (0 is __syncthreads). A full/empty pair orders a buffer between the producer, which
// arrives on "full" and waits on "empty", and the consumers, which do the opposite.
enum Barrier : int {
    kConsumersBar = 1,
    kLandingFullBar0,  // + landing buffer
    kLandingEmptyBar0 = kLandingFullBar0 + kLandingBuffers,
    kV16FullBar = kLandingEmptyBar0 + kLandingBuffers,
    kV16EmptyBar,
    kProducersBar,
};
static_assert(kProducersBar < 16, "sm_90 has 16 named barriers");

template <int D>
__device__ void prefill(const SparseMlaParams& p) {
    using namespace cute;
    constexpr int kHalfSlots = kSlotsPerTile / 2;
    constexpr int kDvPerWg = kDv / Traits::kConsumerWarpgroups;
    constexpr int kAcc = kHeadsPerCta * kHalfSlots / kWarpgroupThreads;  // S values of a thread
    static_assert(Traits::smem_bytes(D) <= 227 * 1024, "shared memory of one SM90 CTA");

    extern __shared__ __align__(1024) uint8_t smem[];
    uint8_t* v16 = smem;  // the fp16 tile first (config.h)
    auto landing = [&](int buffer) { return smem + landing_smem_offset(D) + buffer * e4m3_tile_bytes(D); };
    uint8_t* q_tile = smem + q_smem_offset(D);
    // the validity of a landing tile's slots, a bit each: one word per consumer warpgroup's 32 slots
    auto slot_valid = reinterpret_cast<uint32_t (*)[Traits::kConsumerWarpgroups]>(smem + valid_smem_offset(D));
    auto row_share = reinterpret_cast<float (*)[kHeadsPerCta]>(smem + share_smem_offset(D));

    const int tid = threadIdx.x;
    const WorkItems work(p, kHeadsPerCta);
    const int64_t n_items = work.n_items;

    const Scales scale(p);

    if (tid >= Traits::kConsumerThreads) {
        // P.V reads the whole fp16 tile at once
        produce<Traits, D, kLandingBuffers>(
            p, work, landing(0), v16, slot_valid, kLandingEmptyBar0, kProducersBar,
            [](int buffer) { bar_arrive(kLandingFullBar0 + buffer, Traits::kThreads); },
            [](int, int half) { if (half == 0) bar_sync(kV16EmptyBar, Traits::kThreads); },
            [](int, int half) { if (half == 1) bar_arrive(kV16FullBar, Traits::kThreads); });
        return;
    }

    const ConsumerThread me = enter_consumer<Traits>();
    const int wg = me.wg, wg_tid = me.wg_tid, tig = me.tig, row0 = me.row0;

    // Q of an item into its swizzled tile; heads past h_q are zero rows. Issued for the next item as
    // soon as this item's last QK^T is done, so the epilogue hides it.
    auto load_q = [&](int64_t item) { load_q_rows<D, kHeadsPerCta, Traits::kConsumerThreads>(p, work, item, q_tile, tid); };
    if (blockIdx.x < n_items) load_q(blockIdx.x);

    MmaPV mma_pv;
    auto thr_pv = mma_pv.get_thread_slice(wg_tid);
    Tensor o = partition_fragment_C(mma_pv, Shape<Int<kHeadsPerCta>, Int<kDvPerWg>>{});
    // One descriptor per operand; a K step adds its byte offset (>> 4, the descriptor's address
    // unit), so that no descriptor per K step is held in registers.
    const uint64_t q_desc = q_descriptor<D>(q_tile, wg_tid);
    const uint64_t k_desc0 = k_descriptor<D>(landing(0), wg, wg_tid);
    auto k_desc = [&](int buffer) { return k_desc0 + static_cast<uint64_t>(buffer * e4m3_tile_bytes(D) / 16); };

    // per item: running max (base-2 logits, slot in the low bits), what the exponents subtract (O and
    // the sums are relative to it), the row sums over this warpgroup's own slots, the tile of the max
    float row_max[2] = {}, row_ref[2] = {}, row_sum[2] = {};
    int max_tile[2] = {};

    // The reference follows the running max lazily: O and the row sums are rescaled only when some
    // row of the warp has a max more than kRescaleSlack above its reference, so P stays below
    // 2^kRescaleSlack (fp16 holds it with the same relative precision) and most tiles skip the
    // 128 multiplies of O. Warp w of both warpgroups holds the same 16 rows and the same maxima, so
    // both take the same decision and agree on the reference bit for bit.
    constexpr float kRescaleSlack = 8.f;
    auto follow_max = [&]() {
        const bool behind = row_max[0] > row_ref[0] + kRescaleSlack || row_max[1] > row_ref[1] + kRescaleSlack;
        if (!__any_sync(0xffffffffu, behind)) return;
        for (int r = 0; r < 2; ++r) {
            if (row_max[r] == -CUDART_INF_F) continue;  // no valid slot yet: nothing to rescale
            const float alpha = exp2f(row_ref[r] - row_max[r]);
            row_ref[r] = row_max[r];
            row_sum[r] *= alpha;
            CUTE_UNROLL
            for (int i = 0; i < size(o); ++i)
                if (acc_row(i) == r) o(i) *= alpha;
        }
    };
    // O += P V on this warpgroup's half of d_v, issued without waiting; P from the fp16 tile.
    auto pv = [&]() {
        Tensor sV = make_tensor(make_smem_ptr(reinterpret_cast<half_t*>(v16)), V16Tile<kSlotsPerTile>{});
        Tensor sP = make_tensor(make_smem_ptr(reinterpret_cast<half_t*>(v16) + kPOffset), P16Tile{});
        Tensor tOrP = thr_pv.partition_fragment_A(sP);
        Tensor tOdV = thr_pv.partition_fragment_B(local_tile(sV, Shape<Int<kDvPerWg>, Int<kSlotsPerTile>>{}, make_coord(wg, 0)));
        warpgroup_fence_operand(o);
        warpgroup_arrive();
        CUTE_UNROLL
        for (int k = 0; k < size<2>(tOrP); ++k) gemm(mma_pv, tOrP(_, _, k), tOdV(_, _, k), o);
        warpgroup_commit_batch();
    };

    const uint32_t p_tile = static_cast<uint32_t>(__cvta_generic_to_shared(v16)) + kPOffset * sizeof(half_t);
    int cta_tile = 0;  // this CTA's tiles so far, across items: names the landing buffer
    for (int64_t item = blockIdx.x; item < n_items; item += gridDim.x) {
        const auto [t, head0, n_slots, n_tiles, idx_row, more] = work.take(item);
        await_q(kConsumersBar, Traits::kConsumerThreads);  // and the previous item's epilogue is done in both warpgroups
        clear(o);
        for (int r = 0; r < 2; ++r) row_max[r] = row_ref[r] = -CUDART_INF_F, row_sum[r] = 0.f, max_tile[r] = 0;

        for (int tile = 0; tile < n_tiles; ++tile, ++cta_tile) {
            const int buffer = cta_tile % kLandingBuffers;
            bar_sync(kLandingFullBar0 + buffer, Traits::kThreads);

            // S of this warpgroup's 32 slots: each K step's wgmma starts from zero into one of
            // kQkSets register sets, and is added into s while the next ones run.
            float s[kAcc] = {};
            qk_promoted<D>(q_desc, k_desc(buffer), s, [&] {
                // the previous tile's P.V, issued last, ran under the first K steps: it is done now,
                // and the fp16 tile is free
                warpgroup_fence_operand(o);
                if (tile > 0) bar_arrive(kV16EmptyBar, Traits::kThreads);
            });

            // Online softmax, base 2; this warpgroup's slot of element i is 32 wg + acc_col(i).
            float tile_max[2];
            {
                const uint32_t valid = slot_valid[buffer][wg] >> (2 * tig);  // bit 8 (i / 4) + i % 2: element i
                CUTE_UNROLL
                for (int i = 0; i < kAcc; ++i) {
                    const int slot = kHalfSlots * wg + acc_col(i, tig);
                    s[i] = (valid >> acc_col(i, 0)) & 1 ? with_slot(s[i] * scale.logit, slot) : -CUDART_INF_F;
                }
                // a row's maximum as a tree, not a chain: the softmax's latency is the tile's
                for (int r = 0; r < 2; ++r) {
                    float m[kAcc / 4];
                    CUTE_UNROLL
                    for (int k = 0; k < kAcc / 4; ++k) m[k] = fmaxf(s[4 * k + 2 * r], s[4 * k + 2 * r + 1]);
                    CUTE_UNROLL
                    for (int w = kAcc / 8; w >= 1; w /= 2)
                        CUTE_UNROLL
                        for (int k = 0; k < w; ++k) m[k] = fmaxf(m[k], m[k + w]);
                    tile_max[r] = m[0];
                }
            }
            bar_arrive(kLandingEmptyBar0 + buffer, Traits::kThreads);
            for (int r = 0; r < 2; ++r) {
                tile_max[r] = quad_max(tile_max[r]);
                if (tig == 0) row_share[wg][row0 + 8 * r] = tile_max[r];
            }
            bar_sync(kConsumersBar, Traits::kConsumerThreads);  // both warpgroups' tile maxima posted; P.V of tile - 1 done
            if (tile == n_tiles - 1 && more) load_q(item + gridDim.x);  // both warpgroups' last QK^T is done
            // fmaxf is symmetric, so both warpgroups get the same maximum bit for bit.
            for (int r = 0; r < 2; ++r) {
                const float new_max = fmaxf(row_max[r], fmaxf(tile_max[r], row_share[wg ^ 1][row0 + 8 * r]));
                if (new_max > row_max[r]) max_tile[r] = tile;
                row_max[r] = new_max;
            }
            follow_max();
            // (0 while a row has no valid slot, so that its -inf logits give 0, not NaN)
            const float shift[2] = {row_ref[0] == -CUDART_INF_F ? 0.f : row_ref[0], row_ref[1] == -CUDART_INF_F ? 0.f : row_ref[1]};
            CUTE_UNROLL
            for (int i = 0; i < kAcc; i += 2) {
                const float p0 = exp2f(s[i] - shift[acc_row(i)]), p1 = exp2f(s[i + 1] - shift[acc_row(i)]);
                row_sum[acc_row(i)] += p0 + p1;
                const uint32_t at = p_tile + sw128_byte(row0 + 8 * acc_row(i), kHalfSlots * wg + acc_col(i, tig));
                asm volatile("st.shared.b32 [%0], %1;" ::"r"(at), "r"(pack_half2(p0, p1)) : "memory");
            }
            fence_for_tensor_cores();
            bar_sync(kConsumersBar, Traits::kConsumerThreads);  // P complete

            bar_sync(kV16FullBar, Traits::kThreads);
            pv();  // waited for under the next tile's first K steps
        }
        warpgroup_wait<0>();
        warpgroup_fence_operand(o);
        if (n_tiles > 0) bar_arrive(kV16EmptyBar, Traits::kThreads);

        if (n_tiles == 0 && more) load_q(item + gridDim.x);

        // max_logits and lse: warpgroup wg takes row row0 + 8 wg. The index of its running max's slot
        // is loaded now; the exact logit is computed after the output stores, when O's registers are
        // free for all of the row's loads at once.
        const int64_t h_own = head0 + row0 + 8 * wg;
        // (selects: a register array indexed at run time would go to memory)
        const float max_own = wg ? row_max[1] : row_max[0], ref_own = wg ? row_ref[1] : row_ref[0];
        const bool own_empty = max_own == -CUDART_INF_F;
        int32_t j_max = -1;
        if (h_own < p.h_q && !own_empty) j_max = max_index(max_own, wg ? max_tile[1] : max_tile[0], n_slots, idx_row);

        // Row sums: each warpgroup holds its own slots' share; add them in a fixed order.
        bar_sync(kConsumersBar, Traits::kConsumerThreads);
        for (int r = 0; r < 2; ++r) {
            row_sum[r] = quad_sum(row_sum[r]);
            if (tig == 0) row_share[wg][row0 + 8 * r] = row_sum[r];
        }
        bar_sync(kConsumersBar, Traits::kConsumerThreads);
        float sum[2];
        CUTE_UNROLL
        for (int r = 0; r < 2; ++r) {
            sum[r] = row_share[0][row0 + 8 * r] + row_share[1][row0 + 8 * r];
            // a row past h_q has no output, but its threads still take part in the shuffles below
            const int64_t h = head0 + row0 + 8 * r;
            const bool real = h < p.h_q;
            const bool empty = row_max[r] == -CUDART_INF_F;
            float denom = sum[r];
            if (p.attn_sink && real) denom += exp2f(p.attn_sink[h * p.attn_sink_stride] * kLog2e - row_ref[r]);
            const float o_scale = empty ? 0.f : scale.kv / denom;
            // one base pointer and constant offsets: 64 addresses held at once would spill
            uint16_t* out = p.out + t * p.out_stride_s + (real ? h : 0) * p.out_stride_h + wg * kDvPerWg;
            // its words j of columns 8 (j / 2) + 2 tig, + 1: elements 2 j, 2 j + 1 of O
            store_row<0, 1>(out, r, tig, p.out_rows_16b_aligned, real,
                            [&](int, int j) { return bf16x2(o(2 * j) * o_scale, o(2 * j + 1) * o_scale); });
        }

        // The exact logit of the running max's slot, its Q row from global memory (the Q tile may
        // hold the next item's).
        const float exact_max = exact_logit_from_global<D>(p, work, scale, t, h_own, j_max, tig);
        if (h_own < p.h_q && tig == 0) write_max_lse(p, t, h_own, max_own, ref_own, wg ? sum[1] : sum[0], exact_max, own_empty);
    }
}

}  // namespace sparse_mla::sm90::fallback
