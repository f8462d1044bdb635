// The SM90 FP8 sparse MLA prefill kernel for narrow heads (h_q <= 32, tensor-parallel serving): one
// CTA per query token and all of its heads, so that its tensor work follows the heads asked for (the
// 64-head kernels pad to 64). One template for every QK head dim and one or two M tiles of 16 heads.
//
// The math is mma.sync m16n8k16 in fp16 with fp32 accumulators, the e4m3 K and V converted exactly to
// fp16 in registers after ldmatrix from the landing tile (no fp16 copy of V in shared memory, no
// transposed tile); its rate, not the gather, bounds the kernel (PERF.md, where wgmma is the next
// step). Per tile of 64 slots:
//   1. the producer warp gathers the e4m3 kv rows (cp.async completing on the tile's mbarrier) into a
//      ring of landing tiles; invalid slots become zero rows with a -inf logit;
//   2. each of an M tile's 4 warps computes S = Q K^T on 16 slots, all of d_qk (fp32-grade: exact
//      products, fp32 sums), and posts it to shared memory as A fragments;
//   3. every warp of the M tile reads all 64 slots' S and runs the same online softmax on them (the
//      same rows in the same order: bitwise the same max, reference and sums in each warp), makes P
//      (fp16) as the A of P.V and adds P V into its 128 columns of O, in fp32 registers;
//   4. at an item's end, out, and max_logits and lse from the running max and sum.
// The grid is persistent (two CTAs per SM for one M tile, one for two; items taken in turn).
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <math_constants.h>
#include <stdint.h>

#include "params.h"
#include "sm90/device_helpers.cuh"
#include "sm90/narrow/config.h"
#include "sm90/narrow/ring.cuh"
#include "sm90/work.cuh"

namespace sparse_mla::sm90::narrow {

__device__ inline void ldmatrix_x4(uint32_t (&r)[4], uint32_t addr) {
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3]) : "r"(addr));
}
__device__ inline void ldmatrix_x4_trans(uint32_t (&r)[4], uint32_t addr) {
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0, %1, %2, %3}, [%4];"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3]) : "r"(addr));
}
// d += a b: A 16x16 (4 registers of fp16 pairs), B 16x8 (2), D 16x8 fp32
__device__ inline void mma_f16(float (&d)[4], uint4 a, uint32_t b0, uint32_t b1) {
    asm("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
        "{%0, %1, %2, %3};"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
        : "r"(a.x), "r"(a.y), "r"(a.z), "r"(a.w), "r"(b0), "r"(b1));
}

// The fragment layouts (gid = lane / 4, tig = lane % 4). An ldmatrix x4 at rows R.. of a landing tile
// and chunks c, c + 1 (c even) reads four 8x16-byte matrices: (rows R..R+7, c), (R+8..R+15, c),
// (R..R+7, c+1), (R+8..R+15, c+1); lane L gives the address of row L % 8 of matrix L / 8. Its
// offset from (R, c) in sw64_chunk's layout, for c % 4 == 0 (c % 4 == 2: ^ 32, the chunk's bit 1):
__device__ inline uint32_t ldmatrix_lane_offset(int lane) {
    const int i = lane / 8, r = 8 * (i % 2) + lane % 8;
    return r * 64 + (((i / 2) ^ ((r / 2) % 4)) * 16);
}
__device__ inline uint32_t ldmatrix_at(uint32_t tile, int row0, int c, uint32_t lane_offset) {
    return tile + (c / 4) * (kSlotsPerTile * 64) + row0 * 64 + ((c % 4) ? (lane_offset ^ 32) : lane_offset);
}
// Q K^T's k order: a non-transposed matrix gives lane (gid, tig) bytes 4 tig .. 4 tig + 3 of its
// row (slot gid); converted, the first pair is B's k rows 2 tig, 2 tig + 1 and the second k rows
// 2 tig + 8, + 9. So an MMA's k index is a permutation of the chunk's 16 columns, and Q's A fragment
// follows it (q16 below): a dot product's terms in another order.
// P.V's n order: a transposed matrix gives lane (gid, tig) the bytes V[2 tig][2 gid], V[2 tig][2 gid
// + 1], V[2 tig + 1][2 gid], V[2 tig + 1][2 gid + 1] (rows = slots); byte-permuted to (V[2 tig][2 gid],
// V[2 tig + 1][2 gid]), (V[2 tig][2 gid + 1], V[2 tig + 1][2 gid + 1]) they are the B fragments of two
// n8 tiles, the chunk's even and its odd columns. O's accumulators then hold, per row, the 4
// consecutive columns 4 tig .. 4 tig + 3 of each chunk.
constexpr uint32_t kEvenOddBytes = 0x3120;

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
            *reinterpret_cast<uint2*>(dst) = make_uint2(w0, w1);
        } else {  // rows of bf16 pairs (the host checks it)
            reinterpret_cast<uint32_t*>(dst)[0] = w0, reinterpret_cast<uint32_t*>(dst)[1] = w1;
        }
    }
}

// The consumer warps of M tile mt (heads head0 + 16 mt .. of an item): warp q of the tile computes S on slots 16 q ..
// 16 q + 15 of each tile and owns O's columns 128 q .. 128 q + 127.
template <int D, int kMTiles, int kBuffers>
__device__ void consume(const SparseMlaParams& p, const WorkItems& work, uint8_t* landing, const uint8_t* q8,
                        uint4* q16, float4* sx, const RingBarriers<kBuffers>& bars) {
    constexpr int kChunks = D / 16;
    constexpr int kHeads = kMTileHeads * kMTiles;
    constexpr float kSlack = 8.f;  // P <= 2^kSlack: O and the sums are rescaled only past it
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, gid = lane / 4, tig = lane % 4;
    const int mt = warp / kWarpsPerMTile, q = warp % kWarpsPerMTile;
    const int group_tid = threadIdx.x % kGroupThreads, group_bar = 1 + mt;
    const Scales scale(p);
    const uint32_t lane_offset = ldmatrix_lane_offset(lane);
    const uint32_t landing0 = smem_u32(landing);
    uint4* q16_tile = q16 + mt * kChunks * 32;
    RingCursor at;
    for (int64_t item = blockIdx.x; item < work.n_items; item += gridDim.x) {
        const int64_t t = work.at(item).token, head0 = work.at(item).head0;
        const int64_t n_slots = work.slots_of(t);
        if (n_slots == 0) {  // no valid slot: out 0, max_logits -inf, lse +inf
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
        const int32_t* idx_row = work.indices_of(t);
        {  // the M tile's Q into fp16 A fragments: (gid, tig) of chunk c holds heads gid and gid + 8 at
           // columns 16 c + 4 tig .. + 3, in the k order above
            mbar_wait(bars.q_full(), at.q & 1);
            const uint8_t* tile = q8 + kMTileHeads * mt * D;
            for (int e = group_tid; e < kChunks * 32; e += kGroupThreads) {
                const int c = e / 32, g = (e % 32) / 4, tg = e % 4;
                const uint32_t w0 = *reinterpret_cast<const uint32_t*>(tile + g * D + 16 * c + 4 * tg);
                const uint32_t w1 = *reinterpret_cast<const uint32_t*>(tile + (g + 8) * D + 16 * c + 4 * tg);
                const uint2 h0 = e4m3x4_to_half2x2(w0), h1 = e4m3x4_to_half2x2(w1);
                q16_tile[e] = make_uint4(h0.x, h1.x, h0.y, h1.y);
            }
            mbar_arrive(bars.q_empty());
            bar_sync(group_bar, kGroupThreads);
            ++at.q;
        }
        // the online softmax of this thread's rows gid, gid + 8 (base-2 logits), the same in every
        // warp of the M tile; O relative to ref
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
            // the validity of this thread's S slots 16 q + 8 j + 2 tig + e
            bool valid[2][2];
#pragma unroll
            for (int j = 0; j < 2; ++j)
#pragma unroll
                for (int e = 0; e < 2; ++e) {
                    const int64_t slot = int64_t{tile} * kSlotsPerTile + 16 * q + 8 * j + 2 * tig + e;
                    valid[j][e] = slot < n_slots && work.in_range(__ldg(idx_row + slot));
                }
            const uint32_t tile_s = landing0 + b * (kSlotsPerTile * D);
            mbar_wait(bars.full(b), (at.tile / kBuffers) & 1);

            // 2. S on this warp's 16 slots (n8 tiles j = 0, 1), two partial sums per tile for ILP
            float acc[2][2][4] = {};
#pragma unroll
            for (int c = 0; c < kChunks; c += 2) {
                uint32_t r[4];
                ldmatrix_x4(r, ldmatrix_at(tile_s, 16 * q, c, lane_offset));
#pragma unroll
                for (int cc = 0; cc < 2; ++cc) {
                    const uint4 a = q16_tile[(c + cc) * 32 + lane];
#pragma unroll
                    for (int j = 0; j < 2; ++j) {
                        const uint2 bh = e4m3x4_to_half2x2(r[2 * cc + j]);
                        mma_f16(acc[cc][j], a, bh.x, bh.y);
                    }
                }
            }
            float4* sx_tile = sx + ((at.tile % 2) * kMTiles + mt) * (kWarpsPerMTile * 2 * 32);
#pragma unroll
            for (int j = 0; j < 2; ++j) {
                float s[4];
#pragma unroll
                for (int e = 0; e < 4; ++e)
                    s[e] = valid[j][e % 2] ? (acc[0][j][e] + acc[1][j][e]) * scale.logit : -CUDART_INF_F;
                sx_tile[(2 * q + j) * 32 + lane] = make_float4(s[0], s[1], s[2], s[3]);
            }
            bar_sync(group_bar, kGroupThreads);

            // 3. the tile's 64 slots of rows gid, gid + 8: chunk kc (slots 16 kc ..) as posted by warp kc
            float4 x[4][2];
#pragma unroll
            for (int kc = 0; kc < 4; ++kc)
#pragma unroll
                for (int j = 0; j < 2; ++j) x[kc][j] = sx_tile[(2 * kc + j) * 32 + lane];
            float tile_max[2] = {-CUDART_INF_F, -CUDART_INF_F};
#pragma unroll
            for (int kc = 0; kc < 4; ++kc)
#pragma unroll
                for (int j = 0; j < 2; ++j) {
                    tile_max[0] = fmaxf(tile_max[0], fmaxf(x[kc][j].x, x[kc][j].y));
                    tile_max[1] = fmaxf(tile_max[1], fmaxf(x[kc][j].z, x[kc][j].w));
                }
#pragma unroll
            for (int r = 0; r < 2; ++r) row_max[r] = fmaxf(row_max[r], quad_max(tile_max[r]));
            // the reference follows the max lazily, for all of the warp's rows at once (every warp
            // of the M tile holds all 16 rows: the same choice in each)
            if (__any_sync(0xffffffffu, row_max[0] > ref[0] + kSlack || row_max[1] > ref[1] + kSlack)) {
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
            }
            const float shift[2] = {ref[0] == -CUDART_INF_F ? 0.f : ref[0], ref[1] == -CUDART_INF_F ? 0.f : ref[1]};
            uint4 pa[4];
#pragma unroll
            for (int kc = 0; kc < 4; ++kc) {
                float pv[2][4];
#pragma unroll
                for (int j = 0; j < 2; ++j) {
                    pv[j][0] = exp2f(x[kc][j].x - shift[0]), pv[j][1] = exp2f(x[kc][j].y - shift[0]);
                    pv[j][2] = exp2f(x[kc][j].z - shift[1]), pv[j][3] = exp2f(x[kc][j].w - shift[1]);
                    sum[0] += pv[j][0] + pv[j][1];
                    sum[1] += pv[j][2] + pv[j][3];
                }
                pa[kc] = make_uint4(pack_half2(pv[0][0], pv[0][1]), pack_half2(pv[0][2], pv[0][3]),
                                    pack_half2(pv[1][0], pv[1][1]), pack_half2(pv[1][2], pv[1][3]));
            }
            // O += P V on chunks 8 q + 2 dp, + 1 of d_v
#pragma unroll
            for (int kc = 0; kc < 4; ++kc)
#pragma unroll
                for (int dp = 0; dp < 4; ++dp) {
                    uint32_t r[4];
                    ldmatrix_x4_trans(r, ldmatrix_at(tile_s, 16 * kc, 8 * q + 2 * dp, lane_offset));
#pragma unroll
                    for (int cc = 0; cc < 2; ++cc) {
                        const uint2 lo = e4m3x4_to_half2x2(__byte_perm(r[2 * cc], 0, kEvenOddBytes));
                        const uint2 hi = e4m3x4_to_half2x2(__byte_perm(r[2 * cc + 1], 0, kEvenOddBytes));
                        mma_f16(o[2 * dp + cc][0], pa[kc], lo.x, hi.x);
                        mma_f16(o[2 * dp + cc][1], pa[kc], lo.y, hi.y);
                    }
                }
            mbar_arrive(bars.empty(b));
        }

        // 4. the item's end
#pragma unroll
        for (int r = 0; r < 2; ++r) {
            const int64_t h = head0 + kMTileHeads * mt + gid + 8 * r;
            const float total = quad_sum(sum[r]);  // relative to ref
            if (h >= p.h_q) continue;
            const bool empty = row_max[r] == -CUDART_INF_F;
            float denom = total;
            if (p.attn_sink) denom += exp2f(p.attn_sink[h * p.attn_sink_stride] * kLog2e - ref[r]);
            const float o_scale = empty ? 0.f : scale.kv / denom;
            store_out_row(p, t, h, q, tig, [&](int dl, int k) { return o[dl][k % 2][2 * r + k / 2] * o_scale; });
            if (q == 0 && tig == 0) {
                p.max_logits[t * p.max_logits_stride_s + h * p.max_logits_stride_h] = empty ? -CUDART_INF_F : row_max[r] * kLn2;
                p.lse[t * p.lse_stride_s + h * p.lse_stride_h] = empty ? CUDART_INF_F : (ref[r] + log2f(total)) * kLn2;
            }
        }
    }
}

template <int D, int kMTiles>
__device__ void prefill_heads(const SparseMlaParams& p) {
    extern __shared__ __align__(1024) uint8_t smem[];
    using L = Layout<D, kMTiles>;
    using S = Shape<kMTiles>;
    const WorkItems work(p, S::kHeads);
    const RingBarriers<L::kBuffers> bars{reinterpret_cast<uint64_t*>(smem + L::kBarriers)};
    if (threadIdx.x == 0) bars.init(S::kConsumerThreads);
    __syncthreads();
    if (threadIdx.x / 32 == S::kConsumerWarps) {
        produce<D, kMTiles, L::kBuffers>(p, work, smem + L::kLanding, smem + L::kQ8, bars);
    } else {
        consume<D, kMTiles, L::kBuffers>(p, work, smem + L::kLanding, smem + L::kQ8,
                                         reinterpret_cast<uint4*>(smem + L::kQ16), reinterpret_cast<float4*>(smem + L::kSx), bars);
    }
}

}  // namespace sparse_mla::sm90::narrow

// The registry's entries (narrow/config.h).
namespace sparse_mla::sm90::narrow16 {
template <int D>
__device__ void prefill(const SparseMlaParams& p) { narrow::prefill_heads<D, 1>(p); }
}  // namespace sparse_mla::sm90::narrow16
namespace sparse_mla::sm90::narrow32 {
template <int D>
__device__ void prefill(const SparseMlaParams& p) { narrow::prefill_heads<D, 2>(p); }
}  // namespace sparse_mla::sm90::narrow32
