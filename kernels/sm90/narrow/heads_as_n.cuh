// The consumer warps of the narrow kernel with heads as the MMA's N (narrow8, h_q <= 8): the MMAs are
// transposed, S^T = K Q^T and O^T = V^T P^T, so that 8 heads fill an n8 tile where an M tile would
// pad them to 16 (half of the tensor work of narrow16 for the same rows).
//
// Warp q of the 4 computes S^T on slots 16 q .. 16 q + 15 of each tile (K as A, straight from the
// ldmatrix of the landing tile as in narrow16's Q K^T, Q as B) and owns O^T's rows = d_v columns
// 128 q .. 128 q + 127 (V^T as A, from ldmatrix.trans; P^T as B from registers).
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

// S^T goes through shared memory from its writers' accumulator layout (slot gid, gid + 8 of a warp's
// 16; heads 2 tig, 2 tig + 1) to its readers' B-fragment layout of P^T (head gid; slots 2 tig, 2 tig + 1,
// 2 tig + 8, 2 tig + 9 of each 16: one float4 per 16 slots). The float4 of (head h, reader tig) within
// the 32 of a 16-slot chunk: a reader's 8 lanes take 128 contiguous bytes, and a writer's 32 scalar
// stores fall on 16 banks (the fewest for 2 of a float4's 4 words).
__device__ inline int sx_float4(int h, int tig) { return 4 * (h ^ ((h >> 1) & 1)) + (tig ^ ((h >> 1) & 3)); }

// This thread's part of O^T's rows for head h (as the MMA's column n = h % 2 of the thread's pair):
// d_v columns 16 c + 2 gid, + 1 of each of the warp's 8 chunks c, one bf16 pair each.
template <class Value>
__device__ inline void store_out_pairs(const SparseMlaParams& p, int64_t t, int64_t h, int q, int gid, Value v) {
    uint16_t* row = p.out + t * p.out_stride_s + h * p.out_stride_h + 128 * q + 2 * gid;
#pragma unroll
    for (int dl = 0; dl < 8; ++dl) {
        const __nv_bfloat162 pair = __floats2bfloat162_rn(v(dl, 0), v(dl, 1));
        *reinterpret_cast<uint32_t*>(row + 16 * dl) = *reinterpret_cast<const uint32_t*>(&pair);  // rows of bf16 pairs (the host checks it)
    }
}

template <int D, int kBuffers>
__device__ void consume_heads_as_n(const SparseMlaParams& p, const WorkItems& work, uint8_t* landing, const uint8_t* q8,
                                   uint2* q16, float4* sx, const RingBarriers<kBuffers>& bars, const RingValidity& validity) {
    constexpr int kChunks = D / 16;
    static_assert(kChunks % 4 == 0, "S^T's four partial sums take the chunks in fours");
    constexpr float kSlack = 8.f;  // P <= 2^kSlack: O and the sums are rescaled only past it
    const int q = threadIdx.x / 32, lane = threadIdx.x % 32, gid = lane / 4, tig = lane % 4;
    const Scales scale(p);
    const uint32_t lane_offset = ldmatrix_lane_offset(lane);
    const uint32_t landing0 = smem_u32(landing);
    RingCursor at;
    for (;;) {
        const int64_t item = bars.await_item(at.q);
        if (item >= work.n_items) break;
        const int64_t t = work.at(item).token, head0 = work.at(item).head0;
        const int64_t n_slots = work.slots_of(t);
        // this thread's softmax row: head gid; its O^T columns: heads 2 tig, 2 tig + 1
        const int64_t h_row = head0 + gid;
        const int64_t h_col[2] = {head0 + 2 * tig, head0 + 2 * tig + 1};
        if (n_slots == 0) {  // no valid slot: out 0, max_logits -inf, lse +inf
            bars.release_item(at.q);
#pragma unroll
            for (int n = 0; n < 2; ++n)
                if (h_col[n] < p.h_q) store_out_pairs(p, t, h_col[n], q, gid, [](int, int) { return 0.f; });
            if (q == 0 && tig == 0 && h_row < p.h_q) {
                p.max_logits[t * p.max_logits_stride_s + h_row * p.max_logits_stride_h] = -CUDART_INF_F;
                p.lse[t * p.lse_stride_s + h_row * p.lse_stride_h] = CUDART_INF_F;
            }
            continue;
        }
        {  // Q into fp16 B fragments: lane (gid, tig) of chunk c holds head gid's columns 16 c + 4 tig .. + 3,
           // in the k order of fragments.cuh (as K's A fragments have them)
            for (int e = threadIdx.x; e < kChunks * 32; e += kGroupThreads) {
                const int c = e / 32, g = (e % 32) / 4, tg = e % 4;
                q16[e] = e4m3x4_to_half2x2(*reinterpret_cast<const uint32_t*>(q8 + g * D + 16 * c + 4 * tg));
            }
            bars.release_item(at.q);
            bar_sync(1, kGroupThreads);
        }
        // the online softmax of head gid (base-2 logits), the same in every warp; O^T relative to ref
        float row_max = -CUDART_INF_F, ref = -CUDART_INF_F, sum = 0.f;
        float o[8][4];
#pragma unroll
        for (int dl = 0; dl < 8; ++dl)
#pragma unroll
            for (int e = 0; e < 4; ++e) o[dl][e] = 0.f;
        const int n_tiles = WorkItems::tiles_of(n_slots);
        for (int tile = 0; tile < n_tiles; ++tile, ++at.tile) {
            const int b = at.tile % kBuffers;
            const uint32_t tile_s = landing0 + b * (kSlotsPerTile * D);
            mbar_wait(bars.full(b), (at.tile / kBuffers) & 1);
            // the validity of this thread's S^T rows, slots 16 q + gid + 8 r: bit 4 gid
            const uint2 rows_valid = validity.rows(b, q);
            const bool valid[2] = {(rows_valid.x >> 4 * gid & 1) != 0, (rows_valid.y >> 4 * gid & 1) != 0};

            // S^T on this warp's 16 slots, four partial sums for ILP (added in a fixed order)
            float acc[4][4] = {};
#pragma unroll
            for (int c = 0; c < kChunks; c += 4)
#pragma unroll
                for (int pair = 0; pair < 2; ++pair) {
                    uint32_t r[4];
                    ldmatrix_x4(r, ldmatrix_at(tile_s, 16 * q, c + 2 * pair, lane_offset));
#pragma unroll
                    for (int cc = 0; cc < 2; ++cc) {
                        const uint2 k0 = e4m3x4_to_half2x2(r[2 * cc]), k1 = e4m3x4_to_half2x2(r[2 * cc + 1]);
                        const uint2 bq = q16[(c + 2 * pair + cc) * 32 + lane];
                        mma_f16(acc[2 * pair + cc], make_uint4(k0.x, k1.x, k0.y, k1.y), bq.x, bq.y);
                    }
                }
            float* sx_tile = reinterpret_cast<float*>(sx + (at.tile % 2) * (4 * 32));
#pragma unroll
            for (int e = 0; e < 4; ++e) {
                const float s = (acc[0][e] + acc[1][e]) + (acc[2][e] + acc[3][e]);
                // row gid + 8 (e / 2) of the warp's 16 slots, column 2 tig + e % 2
                sx_tile[4 * (32 * q + sx_float4(2 * tig + e % 2, gid / 2)) + 2 * (e / 2) + gid % 2] =
                    valid[e / 2] ? s * scale.logit : -CUDART_INF_F;
            }
            bar_sync(1, kGroupThreads);

            // head gid's 64 slots: 16 kc + 2 tig, + 1, + 8, + 9 in x[kc]
            float4 x[4];
#pragma unroll
            for (int kc = 0; kc < 4; ++kc) x[kc] = reinterpret_cast<const float4*>(sx_tile)[32 * kc + sx_float4(gid, tig)];
            float tile_max = -CUDART_INF_F;
#pragma unroll
            for (int kc = 0; kc < 4; ++kc) tile_max = fmaxf(tile_max, fmaxf(fmaxf(x[kc].x, x[kc].y), fmaxf(x[kc].z, x[kc].w)));
            row_max = fmaxf(row_max, quad_max(tile_max));
            // the reference follows the max lazily, for all heads at once (every warp holds all of
            // them: the same choice in each); O^T's columns take their head's factor from its row's lane
            if (__any_sync(0xffffffffu, row_max > ref + kSlack)) {
                float alpha = 1.f;
                if (row_max != -CUDART_INF_F) {
                    alpha = exp2f(ref - row_max);
                    ref = row_max;
                    sum *= alpha;
                }
                const float a0 = __shfl_sync(0xffffffffu, alpha, 8 * tig), a1 = __shfl_sync(0xffffffffu, alpha, 8 * tig + 4);
#pragma unroll
                for (int dl = 0; dl < 8; ++dl) o[dl][0] *= a0, o[dl][2] *= a0, o[dl][1] *= a1, o[dl][3] *= a1;
            }
            const float shift = ref == -CUDART_INF_F ? 0.f : ref;
            uint2 pb[4];
#pragma unroll
            for (int kc = 0; kc < 4; ++kc) {
                const float p0 = exp2f(x[kc].x - shift), p1 = exp2f(x[kc].y - shift);
                const float p2 = exp2f(x[kc].z - shift), p3 = exp2f(x[kc].w - shift);
                sum += (p0 + p1) + (p2 + p3);
                pb[kc] = make_uint2(pack_half2(p0, p1), pack_half2(p2, p3));
            }
            // O^T += V^T P^T on this warp's chunks 8 q .. 8 q + 7 of d_v: a chunk's even columns are the A
            // rows gid (column 2 gid), its odd ones the rows gid + 8 (column 2 gid + 1)
#pragma unroll
            for (int kc = 0; kc < 4; ++kc)
                for_v_fragments(tile_s, kc, 8 * q, lane_offset, [&](int dp, int cc, uint2 lo, uint2 hi) {
                    mma_f16(o[2 * dp + cc], make_uint4(lo.x, lo.y, hi.x, hi.y), pb[kc].x, pb[kc].y);
                });
            mbar_arrive(bars.empty(b));
        }

        // the item's end: head gid's totals, and each O^T column's factor from its head's lanes
        const float total = quad_sum(sum);  // relative to ref
        const bool empty = row_max == -CUDART_INF_F;
        float denom = total;
        if (p.attn_sink && h_row < p.h_q) denom += exp2f(p.attn_sink[h_row * p.attn_sink_stride] * kLog2e - ref);
        const float o_scale = empty ? 0.f : scale.kv / denom;
        const float f[2] = {__shfl_sync(0xffffffffu, o_scale, 8 * tig), __shfl_sync(0xffffffffu, o_scale, 8 * tig + 4)};
#pragma unroll
        for (int n = 0; n < 2; ++n)
            if (h_col[n] < p.h_q) store_out_pairs(p, t, h_col[n], q, gid, [&](int dl, int k) { return o[dl][n + 2 * k] * f[n]; });
        if (q == 0 && tig == 0 && h_row < p.h_q) {
            p.max_logits[t * p.max_logits_stride_s + h_row * p.max_logits_stride_h] = empty ? -CUDART_INF_F : row_max * kLn2;
            p.lse[t * p.lse_stride_s + h_row * p.lse_stride_h] = empty ? CUDART_INF_F : (ref + log2f(total)) * kLn2;
        }
    }
}

}  // namespace sparse_mla::sm90::narrow
