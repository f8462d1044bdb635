// The consumer warps of the narrow kernels with heads as the MMA's M (narrow16, narrow32): per M tile
// of 16 heads, 4 warps; S = Q K^T with Q as A, computed by pairs of warps over halves of d_qk; P.V
// with P as A, each warp's P of its own 16 slots exchanged through shared memory.
#pragma once

#include <cuda_bf16.h>
#include <math_constants.h>
#include <stdint.h>

#include "params.h"
#include "sm90/device_helpers.cuh"
#include "sm90/narrow/config.h"
#include "sm90/narrow/fragments.cuh"
#include "sm90/narrow/ring.cuh"
#include "sm90/work.cuh"

namespace sparse_mla::sm90::narrow {

// This thread's part of a row of out (head h of token t): columns 4 tig .. + 3 of each of its 8 chunks
// (128 q + 16 dl ..), each 4 values v(dl, k), 8 bytes.
template <class Value>
__device__ inline void store_out_row(const SparseMlaParams& p, int64_t t, int64_t h, int q, int tig, Value v) {
    uint16_t* row = p.out + t * p.out_stride_s + h * p.out_stride_h + 128 * q + 4 * tig;
#pragma unroll
    for (int dl = 0; dl < 8; ++dl) {
        const __nv_bfloat162 lo = __floats2bfloat162_rn(v(dl, 0), v(dl, 1)), hi = __floats2bfloat162_rn(v(dl, 2), v(dl, 3));
        const uint32_t w0 = *reinterpret_cast<const uint32_t*>(&lo), w1 = *reinterpret_cast<const uint32_t*>(&hi);
        uint16_t* dst = row + 16 * dl;
        if (p.out_rows_16b_aligned) {
            st_global_v2(dst, w0, w1);
        } else {  // rows of bf16 pairs (the host checks it)
            reinterpret_cast<uint32_t*>(dst)[0] = w0, reinterpret_cast<uint32_t*>(dst)[1] = w1;
        }
    }
}

// What the warps of an M tile exchange per tile (Shape::kMExchangeBytes): each warp's P as the A
// fragments of its k chunk, in lane order, and each row's maxima over each warp's 16 slots (x: warp 0 ..
// w: warp 3).
struct Exchange {
    uint4* p;         // [warp][lane]
    float4* row_max;  // [row]
};

// The consumer warps of M tile mt (heads head0 + 16 mt .. of an item): warp q of the tile owns S on slots
// 16 q .. 16 q + 15 of each tile and O's columns 128 q .. 128 q + 127. QK^T is computed by pairs (warps
// q and q ^ 1): each takes both warps' 32 slots on one half of d_qk (alternate chunk pairs), so that
// it reads half of Q's fragments a tile and applies each to four n8 tiles (~15% less shared-memory
// traffic a tile), and adds its partner's half of its own slots (`partial`, traded on a barrier of
// the two warps).
template <int D, int kMTiles, int kBuffers>
__device__ void consume_heads_as_m(const SparseMlaParams& p, const WorkItems& work, uint8_t* landing, const uint8_t* q8,
                                   uint4* q16, uint8_t* xchg, float4* sums, float4* partial,
                                   const RingBarriers<kBuffers>& bars, const RingValidity& validity) {
    constexpr int kChunks = D / 16;
    static_assert(kChunks % 4 == 0, "the pair's warps take alternate chunk pairs (ldmatrix x4 takes two)");
    constexpr float kSlack = 8.f;  // P <= 2^kSlack: O and the sums are rescaled only past it
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, gid = lane / 4, tig = lane % 4;
    const int mt = warp / kWarpsPerMTile, q = warp % kWarpsPerMTile;
    const int group_tid = threadIdx.x % kGroupThreads, group_bar = 1 + mt;
    // this warp's half of d_qk, chunks 4 i + 2 qk_half and 4 i + 2 qk_half + 1, and its pair's barrier
    const int qk_half = q % 2, pair_bar = 1 + kMTiles + 2 * mt + q / 2;
    static_assert(1 + 3 * kMTiles <= kProducersBar, "sm_90 has 16 named barriers, the last the producers'");
    float4* partial_out = partial + (mt * kWarpsPerMTile + q) * 2 * 32 + lane;
    const float4* partial_in = partial + (mt * kWarpsPerMTile + (q ^ 1)) * 2 * 32 + lane;
    const Scales scale(p);
    const uint32_t lane_offset = ldmatrix_lane_offset(lane);
    const uint32_t landing0 = smem_u32(landing);
    uint4* q16_tile = q16 + mt * kChunks * 32;
    const uint4* q16_half = q16_tile + 2 * qk_half * 32 + lane;
    const uint32_t half_offset = qk_half ? lane_offset ^ 32 : lane_offset;  // ldmatrix_at's at chunk 4 i + 2 qk_half
    constexpr int kXBytes = Shape<kMTileHeads>::kMExchangeBytes;
    auto exchange = [&](int buffer) {
        uint8_t* x = xchg + (buffer * kMTiles + mt) * kXBytes;
        return Exchange{reinterpret_cast<uint4*>(x), reinterpret_cast<float4*>(x + kWarpsPerMTile * 32 * 16)};
    };
    RingCursor at;
    for (;;) {
        const int64_t item = bars.await_item(at.q);
        if (item >= work.n_items) break;
        const int64_t t = work.at(item).token, head0 = work.at(item).head0;
        const int64_t n_slots = work.slots_of(t);
        if (n_slots == 0) {  // no valid slot: out 0, max_logits -inf, lse +inf
            bars.release_item(at.q);
#pragma unroll
            for (int r = 0; r < 2; ++r) {
                const int64_t h = head0 + kMTileHeads * mt + gid + 8 * r;
                if (h >= p.h_q) continue;
                store_out_row(p, t, h, q, tig, [](int, int) { return 0.f; });
                if (q == 0 && tig == 0) {
                    p.max_logits[t * p.max_logits_stride_s + h * p.max_logits_stride_h] = -CUDART_INF_F;
                    p.lse[t * p.lse_stride_s + h * p.lse_stride_h] = CUDART_INF_F;
                }
            }
            continue;
        }
        {  // the M tile's Q into fp16 A fragments: (gid, tig) of chunk c holds heads gid and gid + 8 at
           // columns 16 c + 4 tig .. + 3, in the k order of fragments.cuh
            const uint8_t* tile = q8 + kMTileHeads * mt * D;
            for (int e = group_tid; e < kChunks * 32; e += kGroupThreads) {
                const int c = e / 32, g = (e % 32) / 4, tg = e % 4;
                const uint32_t w0 = *reinterpret_cast<const uint32_t*>(tile + g * D + 16 * c + 4 * tg);
                const uint32_t w1 = *reinterpret_cast<const uint32_t*>(tile + (g + 8) * D + 16 * c + 4 * tg);
                const uint2 h0 = e4m3x4_to_half2x2(w0), h1 = e4m3x4_to_half2x2(w1);
                q16_tile[e] = make_uint4(h0.x, h1.x, h0.y, h1.y);
            }
            bars.release_item(at.q);
            bar_sync(group_bar, kGroupThreads);
        }
        // the online softmax of this thread's rows gid, gid + 8 (base-2 logits): the max and reference
        // the same in every warp of the M tile, the sums over this warp's slots; O relative to ref
        float row_max[2] = {-CUDART_INF_F, -CUDART_INF_F}, ref[2] = {-CUDART_INF_F, -CUDART_INF_F}, sum[2] = {0.f, 0.f};
        float o[8][2][4];
#pragma unroll
        for (int dl = 0; dl < 8; ++dl)
#pragma unroll
            for (int n = 0; n < 2; ++n)
#pragma unroll
                for (int e = 0; e < 4; ++e) o[dl][n][e] = 0.f;
        const int n_tiles = WorkItems::tiles_of(n_slots);
        for (int tile = 0; tile < n_tiles; ++tile, ++at.tile) {
            const int b = at.tile % kBuffers;
            const uint32_t tile_s = landing0 + b * (kSlotsPerTile * D);
            mbar_wait(bars.full(b), (at.tile / kBuffers) & 1);
            // the validity of this thread's S slots 16 q + 8 j + 2 tig + e: bits 8 tig + 4 e
            const uint2 rows_valid = validity.rows(b, q);
            const uint32_t valid_bits[2] = {rows_valid.x >> 8 * tig, rows_valid.y >> 8 * tig};

            // 2. S on the pair's 32 slots over this warp's half of d_qk: n8 tiles 0, 1 its own slots
            // 16 q .., 2, 3 its partner's
            float acc[4][4] = {};
#pragma unroll
            for (int i = 0; i < kChunks / 4; ++i) {
                uint32_t r[2][4];
#pragma unroll
                for (int m = 0; m < 2; ++m)
                    ldmatrix_x4(r[m], ldmatrix_at(tile_s, 16 * (q ^ m), 4 * i, half_offset));
#pragma unroll
                for (int cc = 0; cc < 2; ++cc) {
                    const uint4 a = q16_half[(4 * i + cc) * 32];
#pragma unroll
                    for (int j = 0; j < 4; ++j) {
                        const uint2 bh = e4m3x4_to_half2x2(r[j / 2][2 * cc + j % 2]);
                        mma_f16(acc[j], a, bh.x, bh.y);
                    }
                }
            }
            // the partner's slots to it, its half of this warp's slots from it (read before this
            // tile's group barrier, which the partner passes before it writes again)
#pragma unroll
            for (int j = 0; j < 2; ++j)
                partial_out[32 * j] = make_float4(acc[2 + j][0], acc[2 + j][1], acc[2 + j][2], acc[2 + j][3]);
            bar_sync(pair_bar, 2 * 32);  // the pair's two warps
            float s_own[2][4];
#pragma unroll
            for (int j = 0; j < 2; ++j) {
                const float4 y = partial_in[32 * j];
                s_own[j][0] = acc[j][0] + y.x, s_own[j][1] = acc[j][1] + y.y;
                s_own[j][2] = acc[j][2] + y.z, s_own[j][3] = acc[j][3] + y.w;
            }
            // 3. the softmax of the warp's own 16 slots: rows gid (e < 2), gid + 8; the tile's row
            // maxima come from every warp's through shared memory
            float sv[2][4], warp_max[2] = {-CUDART_INF_F, -CUDART_INF_F};
#pragma unroll
            for (int j = 0; j < 2; ++j)
#pragma unroll
                for (int e = 0; e < 4; ++e) {
                    sv[j][e] = (valid_bits[j] >> 4 * (e % 2) & 1) ? s_own[j][e] * scale.logit : -CUDART_INF_F;
                    warp_max[e / 2] = fmaxf(warp_max[e / 2], sv[j][e]);
                }
            const Exchange x = exchange(at.tile % 2);
            uint4 pa;
            float tile_sum[2];
            auto make_p = [&]() {  // P (the A fragment of P.V's k chunk q) and its row sums, relative to ref
                const float shift[2] = {ref[0] == -CUDART_INF_F ? 0.f : ref[0], ref[1] == -CUDART_INF_F ? 0.f : ref[1]};
                float pv[2][4];
#pragma unroll
                for (int j = 0; j < 2; ++j)
#pragma unroll
                    for (int e = 0; e < 4; ++e) pv[j][e] = exp2f(sv[j][e] - shift[e / 2]);
                tile_sum[0] = (pv[0][0] + pv[0][1]) + (pv[1][0] + pv[1][1]);
                tile_sum[1] = (pv[0][2] + pv[0][3]) + (pv[1][2] + pv[1][3]);
                pa = make_uint4(pack_half2(pv[0][0], pv[0][1]), pack_half2(pv[0][2], pv[0][3]),
                                pack_half2(pv[1][0], pv[1][1]), pack_half2(pv[1][2], pv[1][3]));
                x.p[q * 32 + lane] = pa;
            };
            // P is made before the maxima are known, against the reference as it is: it stands unless
            // a row's max passes ref + kSlack (the same finding in every warp: they read the same
            // maxima), which the first tile always does
            const bool fresh = __any_sync(0xffffffffu, ref[0] == -CUDART_INF_F || ref[1] == -CUDART_INF_F);
            if (!fresh) make_p();
#pragma unroll
            for (int r = 0; r < 2; ++r) {
                warp_max[r] = quad_max(warp_max[r]);
                if (tig == 0) reinterpret_cast<float*>(x.row_max + gid + 8 * r)[q] = warp_max[r];
            }
            bar_sync(group_bar, kGroupThreads);
#pragma unroll
            for (int r = 0; r < 2; ++r) {
                const float4 m = x.row_max[gid + 8 * r];
                row_max[r] = fmaxf(row_max[r], fmaxf(fmaxf(m.x, m.y), fmaxf(m.z, m.w)));
            }
            if (fresh || __any_sync(0xffffffffu, row_max[0] > ref[0] + kSlack || row_max[1] > ref[1] + kSlack)) {
#pragma unroll
                for (int r = 0; r < 2; ++r) {
                    if (row_max[r] == -CUDART_INF_F) continue;
                    const float alpha = exp2f(ref[r] - row_max[r]);
                    ref[r] = row_max[r];
                    sum[r] *= alpha;
#pragma unroll
                    for (int dl = 0; dl < 8; ++dl)
#pragma unroll
                        for (int n = 0; n < 2; ++n) o[dl][n][2 * r] *= alpha, o[dl][n][2 * r + 1] *= alpha;
                }
                make_p();
                bar_sync(group_bar, kGroupThreads);
            }
            sum[0] += tile_sum[0], sum[1] += tile_sum[1];
            uint4 pk[4];
#pragma unroll
            for (int kc = 0; kc < 4; ++kc) pk[kc] = kc == q ? pa : x.p[kc * 32 + lane];
            // O += P V on chunks 8 q .. 8 q + 7 of d_v: the chunk's even columns in n8 tile 0, its odd ones in 1
#pragma unroll
            for (int kc = 0; kc < 4; ++kc)
                for_v_fragments(tile_s, kc, 8 * q, lane_offset, [&](int dp, int cc, uint2 lo, uint2 hi) {
                    mma_f16(o[2 * dp + cc][0], pk[kc], lo.x, hi.x);
                    mma_f16(o[2 * dp + cc][1], pk[kc], lo.y, hi.y);
                });
            mbar_arrive(bars.empty(b));
        }

        // 4. the item's end: each row's sum over the warps' slots, in a fixed order
        float total[2];
#pragma unroll
        for (int r = 0; r < 2; ++r) {
            const float part = quad_sum(sum[r]);  // relative to ref
            if (tig == 0) reinterpret_cast<float*>(sums + kMTileHeads * mt + gid + 8 * r)[q] = part;
        }
        bar_sync(group_bar, kGroupThreads);
#pragma unroll
        for (int r = 0; r < 2; ++r) {
            const float4 w = sums[kMTileHeads * mt + gid + 8 * r];
            total[r] = (w.x + w.y) + (w.z + w.w);
        }
#pragma unroll
        for (int r = 0; r < 2; ++r) {
            const int64_t h = head0 + kMTileHeads * mt + gid + 8 * r;
            if (h >= p.h_q) continue;
            const bool empty = row_max[r] == -CUDART_INF_F;
            float denom = total[r];
            if (p.attn_sink) denom += exp2f(p.attn_sink[h * p.attn_sink_stride] * kLog2e - ref[r]);
            const float o_scale = empty ? 0.f : scale.kv / denom;
            store_out_row(p, t, h, q, tig, [&](int dl, int k) { return o[dl][k % 2][2 * r + k / 2] * o_scale; });
            if (q == 0 && tig == 0) {
                p.max_logits[t * p.max_logits_stride_s + h * p.max_logits_stride_h] = empty ? -CUDART_INF_F : row_max[r] * kLn2;
                p.lse[t * p.lse_stride_s + h * p.lse_stride_h] = empty ? CUDART_INF_F : (ref[r] + log2f(total[r])) * kLn2;
            }
        }
    }
}

}  // namespace sparse_mla::sm90::narrow
