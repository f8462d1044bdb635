// The SM90 FP8 sparse MLA prefill kernel, one template for every QK head dim.
//
// One CTA computes one query token for 64 heads. A producer warpgroup and eight consumer warps in 4
// head groups of 16 heads; the two warps of a group split each tile's slots for S and the columns of
// d_v for O. They meet on named barriers (kv tile full/empty per stage, V^T full/empty). Per tile of
// 64 slots:
//   1. the producer gathers the kv rows (cp.async) one tile ahead; invalid slots become zero rows
//      with a -inf logit, and are never read;
//   2. the producer converts the V part to fp16 and transposes it, because the tensor cores want the
//      slot dimension contiguous for P.V, while the consumers compute the next tile's S;
//   3. S = Q K^T with FP8 mma.sync (m16n8k32) on the warp's 32 slots; each 32-wide K step starts from
//      zero and is added into fp32 registers (sm_90a runs this instruction as fp16 HMMAs, which sum
//      exactly; FP8 wgmma does not, see PERF.md);
//   4. online softmax in base 2, the row max exchanged within the pair; P (fp16, in [0, 1]) goes
//      through shared memory so that each warp multiplies all 64 slots by its half of V^T.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_fp8.h>
#include <math_constants.h>

#include <cute/arch/copy_sm75.hpp>
#include <cute/arch/copy_sm80.hpp>
#include <cute/arch/mma_sm80.hpp>
#include <cute/arch/mma_sm89.hpp>

#include "params.h"
#include "sm90/config.h"

namespace sparse_mla::sm90 {

constexpr float kLog2e = 1.4426950408889634f;
constexpr float kLn2 = 0.6931471805599453f;

// 16 bytes of a row into shared memory; zeros when !valid, and then src is never dereferenced.
__device__ inline void copy_chunk(uint8_t* dst, const uint8_t* src, bool valid, bool aligned) {
    if (aligned) {
        using Copy = cute::SM80_CP_ASYNC_CACHEGLOBAL_ZFILL<cute::uint128_t>;
        Copy::copy(*reinterpret_cast<const cute::uint128_t*>(src), *reinterpret_cast<cute::uint128_t*>(dst), valid);
    } else if (valid) {
        for (int i = 0; i < 16; ++i) dst[i] = src[i];
    } else {
        for (int i = 0; i < 16; ++i) dst[i] = 0;
    }
}

// ldmatrix of four 8x8 b16 matrices; for fp8 rows the fragment layout is that of mma.m16n8k32.
__device__ inline void ldsm_x4(const void* p, uint32_t (&r)[4]) {
    cute::SM75_U32x4_LDSM_N::copy(*reinterpret_cast<const cute::uint128_t*>(p), r[0], r[1], r[2], r[3]);
}

// Named barriers (0 is __syncthreads). A full/empty pair orders a buffer between the producer, which
// arrives on "full" and waits on "empty", and the consumers, which do the opposite.
enum Barrier : int {
    kConsumersBar = 1,
    kPairBar0 = 2,  // + head group: the two warps of a group
    kKvFullBar0 = kPairBar0 + kHeadGroups,  // + stage
    kKvEmptyBar0 = kKvFullBar0 + kKvStages,
    kVtFullBar = kKvEmptyBar0 + kKvStages,
    kVtEmptyBar,
    kProducersBar,
};
static_assert(kProducersBar < 16, "sm_90 has 16 named barriers");

__device__ inline void bar_sync(int id, int threads) {
    asm volatile("bar.sync %0, %1;" ::"r"(id), "r"(threads) : "memory");
}
__device__ inline void bar_arrive(int id, int threads) {
    asm volatile("bar.arrive %0, %1;" ::"r"(id), "r"(threads) : "memory");
}

__device__ inline uint32_t e4m3x2_to_half2(uint32_t two) {
    const __half2_raw h = __nv_cvt_fp8x2_to_halfraw2(static_cast<__nv_fp8x2_storage_t>(two), __NV_E4M3);
    return static_cast<uint32_t>(h.x) | (static_cast<uint32_t>(h.y) << 16);
}

__device__ inline uint32_t pack_half2(float lo, float hi) {
    __half2 h = __floats2half2_rn(lo, hi);
    return *reinterpret_cast<uint32_t*>(&h);
}

__device__ inline float quad_max(float x) {
    x = fmaxf(x, __shfl_xor_sync(0xffffffffu, x, 1));
    return fmaxf(x, __shfl_xor_sync(0xffffffffu, x, 2));
}

__device__ inline float quad_sum(float x) {
    x += __shfl_xor_sync(0xffffffffu, x, 1);
    return x + __shfl_xor_sync(0xffffffffu, x, 2);
}

template <int D>
__device__ void prefill(const SparseMlaParams& p) {
    static_assert(D % 32 == 0 && D >= kDv, "d_qk must be a multiple of 32 and hold d_v");
    constexpr int kChunks = D / 16;                  // 16-byte chunks of an fp8 row
    constexpr int kRow = fp8_row_bytes(D);
    constexpr int kHalfRow = half_row();
    constexpr int kSTiles = kSlotsPerTile / 2 / 8;  // n8 tiles of S per warp: its half of the slots
    constexpr int kOTiles = kDv / 2 / 8;            // n8 tiles of O per warp: its half of d_v

    extern __shared__ __align__(128) uint8_t smem[];
    uint8_t* q_s = smem + q_smem_offset(D);
    uint8_t* kv_s = smem + kv_smem_offset(D);
    uint16_t* vt_s = reinterpret_cast<uint16_t*>(smem + vt_smem_offset(D));
    uint16_t* p_s = reinterpret_cast<uint16_t*>(smem + p_smem_offset(D));
    // kv row of each slot, -1 where the slot is invalid
    auto slot_rows = reinterpret_cast<int32_t (*)[kSlotsPerTile]>(smem + slots_smem_offset(D));
    float* pair_s = reinterpret_cast<float*>(smem + pair_smem_offset(D));

    const int tid = threadIdx.x;
    const int64_t n_head_blocks = head_blocks(p.h_q);
    const int64_t t = blockIdx.x / n_head_blocks;
    const int64_t head0 = (blockIdx.x % n_head_blocks) * kHeadsPerCta;

    const float q_scale = p.q_scale_ptr ? *p.q_scale_ptr : p.q_scale;
    const float kv_scale = p.kv_scale_ptr ? *p.kv_scale_ptr : p.kv_scale;
    const float logit_scale = p.sm_scale * q_scale * kv_scale * kLog2e;

    int64_t n_slots = p.topk;
    if (p.topk_length) {
        const int64_t len = p.topk_length[t * p.topk_length_stride];
        n_slots = len < 0 ? 0 : (len < p.topk ? len : p.topk);
    }
    const int64_t n_tiles = (n_slots + kSlotsPerTile - 1) / kSlotsPerTile;
    const int32_t* idx_row = p.indices + t * p.indices_stride_s;

    if (tid >= kConsumerThreads) {
        asm volatile("setmaxnreg.dec.sync.aligned.u32 %0;" ::"n"(kProducerRegisters));
        const int ptid = tid - kConsumerThreads;
        auto fill_slot_table = [&](int64_t tile) {
            if (ptid < kSlotsPerTile) {
                const int64_t slot = tile * kSlotsPerTile + ptid;
                const int32_t j = slot < n_slots ? idx_row[slot] : -1;
                slot_rows[tile % kSlotTables][ptid] = j >= 0 && j < p.s_kv ? j : -1;
            }
        };
        auto gather = [&](int64_t tile) {
            const int32_t* rows = slot_rows[tile % kSlotTables];
            uint8_t* dst = kv_s + (tile % kKvStages) * kSlotsPerTile * kRow;
            for (int u = ptid; u < kSlotsPerTile * kChunks; u += kProducerThreads) {
                const int r = u / kChunks, c = u % kChunks;
                const int32_t j = rows[r];
                const uint8_t* src = j >= 0 ? p.kv + j * p.kv_stride_s + c * 16 : p.kv;
                copy_chunk(dst + r * kRow + c * 16, src, j >= 0, p.rows_16b_aligned);
            }
        };
        // V^T in fp16: each unit is two adjacent slots x 16 columns, stored as slot pairs.
        auto transpose_v = [&](int64_t tile) {
            const uint8_t* kv_tile = kv_s + (tile % kKvStages) * kSlotsPerTile * kRow;
            for (int u = ptid; u < (kSlotsPerTile / 2) * (kDv / 16); u += kProducerThreads) {
                const int pair = u % (kSlotsPerTile / 2), c = (u / (kSlotsPerTile / 2)) * 16;
                const uint4 a = *reinterpret_cast<const uint4*>(kv_tile + 2 * pair * kRow + c);
                const uint4 b = *reinterpret_cast<const uint4*>(kv_tile + (2 * pair + 1) * kRow + c);
                const uint32_t wa[4] = {a.x, a.y, a.z, a.w}, wb[4] = {b.x, b.y, b.z, b.w};
                uint32_t* dst = reinterpret_cast<uint32_t*>(vt_s + c * kHalfRow + 2 * pair);
#pragma unroll
                for (int w = 0; w < 8; ++w) {  // two columns per step
                    const uint32_t ha = e4m3x2_to_half2(wa[w / 2] >> (16 * (w % 2)));
                    const uint32_t hb = e4m3x2_to_half2(wb[w / 2] >> (16 * (w % 2)));
                    dst[(2 * w) * (kHalfRow / 2)] = __byte_perm(ha, hb, 0x5410);
                    dst[(2 * w + 1) * (kHalfRow / 2)] = __byte_perm(ha, hb, 0x7632);
                }
            }
        };
        // Tile i: gather i, then write V^T of tile i - 1 while the consumers compute S of tile i - 1.
        // Every arrival of the consumers is waited for exactly once, also past the last tile.
        for (int64_t tile = 0; tile < n_tiles; ++tile) {
            const int stage = tile % kKvStages;
            if (tile >= kKvStages) bar_sync(kKvEmptyBar0 + stage, kThreads);  // S of tile - 2 is done
            fill_slot_table(tile);
            bar_sync(kProducersBar, kProducerThreads);  // slot table written; tile - 1 landed everywhere
            gather(tile);
            if (tile >= 1) {
                if (tile >= 2) bar_sync(kVtEmptyBar, kThreads);  // P.V of tile - 2 is done
                transpose_v(tile - 1);
                bar_arrive(kVtFullBar, kThreads);
            }
            cute::cp_async_wait<0>();
            bar_arrive(kKvFullBar0 + stage, kThreads);
        }
        if (n_tiles >= 1) {
            bar_sync(kProducersBar, kProducerThreads);  // the last tile landed everywhere
            if (n_tiles >= 2) bar_sync(kVtEmptyBar, kThreads);
            transpose_v(n_tiles - 1);
            bar_arrive(kVtFullBar, kThreads);
            for (int64_t tile = n_tiles >= 2 ? n_tiles - 2 : 0; tile < n_tiles; ++tile)
                bar_sync(kKvEmptyBar0 + tile % kKvStages, kThreads);
            bar_sync(kVtEmptyBar, kThreads);
        }
        return;
    }

    asm volatile("setmaxnreg.inc.sync.aligned.u32 %0;" ::"n"(kConsumerRegisters));
    const int lane = tid % 32, warp = tid / 32;
    const int gid = lane / 4, tig = lane % 4;
    const int head_group = warp % kHeadGroups, half = warp / kHeadGroups;
    const int partner = warp ^ kHeadGroups;
    auto pair_barrier = [&] { bar_sync(kPairBar0 + head_group, 64); };

    for (int u = tid; u < kHeadsPerCta * kChunks; u += kConsumerThreads) {
        const int r = u / kChunks, c = u % kChunks;
        const bool valid = head0 + r < p.h_q;
        const uint8_t* src = valid ? p.q + t * p.q_stride_s + (head0 + r) * p.q_stride_h + c * 16 : p.q;
        copy_chunk(q_s + r * kRow + c * 16, src, valid, p.rows_16b_aligned);
    }
    cute::cp_async_wait<0>();
    bar_sync(kConsumersBar, kConsumerThreads);

    float o[kOTiles][4];
    for (int j = 0; j < kOTiles; ++j)
        for (int i = 0; i < 4; ++i) o[j][i] = 0.f;
    float row_max[2] = {-CUDART_INF_F, -CUDART_INF_F};  // base-2 logits of rows gid and gid + 8
    float row_sum[2] = {0.f, 0.f};                       // over this thread's slots, reduced at the end

    // Fragment addresses of this lane for ldmatrix: Q (A of QK^T), kv rows (B), P (A of P.V), V^T (B).
    const int quad = lane / 8, row8 = lane % 8;
    const uint8_t* q_lane = q_s + (head_group * 16 + (quad % 2) * 8 + row8) * kRow + (quad / 2) * 16;
    const int k_lane = (half * (kSlotsPerTile / 2) + (quad / 2) * 8 + row8) * kRow + (quad % 2) * 16;
    const uint16_t* p_group = p_s + head_group * 16 * kHalfRow;
    const uint16_t* p_lane = p_group + ((quad % 2) * 8 + row8) * kHalfRow + (quad / 2) * 8;
    const uint16_t* vt_lane = vt_s + (half * (kDv / 2) + (quad / 2) * 8 + row8) * kHalfRow + (quad % 2) * 8;

    for (int64_t tile = 0; tile < n_tiles; ++tile) {
        const int stage = tile % kKvStages;
        bar_sync(kKvFullBar0 + stage, kThreads);
        const uint8_t* kv_tile = kv_s + stage * kSlotsPerTile * kRow;
        const int32_t* rows = slot_rows[tile % kSlotTables];

        // S = Q K^T: this warp's 16 heads x its 32 slots.
        float s[kSTiles][4];
        for (int j = 0; j < kSTiles; ++j)
            for (int i = 0; i < 4; ++i) s[j][i] = 0.f;
#pragma unroll 2
        for (int k = 0; k < D; k += 32) {
            uint32_t a[4];
            ldsm_x4(q_lane + k, a);
#pragma unroll
            for (int jp = 0; jp < kSTiles / 2; ++jp) {
                uint32_t b[4];
                ldsm_x4(kv_tile + k_lane + jp * 16 * kRow + k, b);
#pragma unroll
                for (int h = 0; h < 2; ++h) {
                    float d[4];
                    cute::SM89_16x8x32_F32E4M3E4M3F32_TN::fma(d[0], d[1], d[2], d[3], a[0], a[1], a[2], a[3],
                                                              b[2 * h], b[2 * h + 1], 0.f, 0.f, 0.f, 0.f);
                    for (int i = 0; i < 4; ++i) s[2 * jp + h][i] += d[i];
                }
            }
        }
        bar_arrive(kKvEmptyBar0 + stage, kThreads);

        // Online softmax, base 2. Element i of tile j: row gid + 8 (i / 2), slot 32 half + 8 j + 2 tig + i % 2.
        float tile_max[2] = {-CUDART_INF_F, -CUDART_INF_F};
        for (int j = 0; j < kSTiles; ++j)
            for (int i = 0; i < 4; ++i) {
                const int slot = half * (kSlotsPerTile / 2) + 8 * j + 2 * tig + i % 2;
                s[j][i] = rows[slot] >= 0 ? s[j][i] * logit_scale : -CUDART_INF_F;
                tile_max[i / 2] = fmaxf(tile_max[i / 2], s[j][i]);
            }
        for (int r = 0; r < 2; ++r) {
            tile_max[r] = quad_max(tile_max[r]);
            if (tig == 0) pair_s[warp * 16 + gid + 8 * r] = tile_max[r];
        }
        bar_sync(kConsumersBar, kConsumerThreads);  // the pair's tile maxima posted
        float shift[2];
        for (int r = 0; r < 2; ++r) {
            // fmaxf is symmetric, so both warps of the pair get the same maximum bit for bit.
            const float new_max = fmaxf(row_max[r], fmaxf(tile_max[r], pair_s[partner * 16 + gid + 8 * r]));
            shift[r] = new_max == -CUDART_INF_F ? 0.f : new_max;  // all slots so far invalid
            const float alpha = exp2f(row_max[r] - shift[r]);
            row_max[r] = new_max;
            row_sum[r] *= alpha;
            for (int j = 0; j < kOTiles; ++j) {
                o[j][2 * r] *= alpha;
                o[j][2 * r + 1] *= alpha;
            }
        }
        for (int j = 0; j < kSTiles; ++j) {
            for (int i = 0; i < 4; ++i) {
                s[j][i] = exp2f(s[j][i] - shift[i / 2]);
                row_sum[i / 2] += s[j][i];
            }
            const int col = half * (kSlotsPerTile / 2) + 8 * j + 2 * tig;
            uint32_t* p_row = reinterpret_cast<uint32_t*>(p_s + (head_group * 16 + gid) * kHalfRow + col);
            p_row[0] = pack_half2(s[j][0], s[j][1]);
            p_row[8 * kHalfRow / 2] = pack_half2(s[j][2], s[j][3]);
        }
        pair_barrier();  // the pair's P is complete
        bar_sync(kVtFullBar, kThreads);

        // O += P V: all 64 slots of P, this warp's half of V^T.
#pragma unroll
        for (int kk = 0; kk < kSlotsPerTile / 16; ++kk) {
            uint32_t a[4];
            ldsm_x4(p_lane + kk * 16, a);
#pragma unroll
            for (int np = 0; np < kOTiles / 2; ++np) {
                uint32_t b[4];
                ldsm_x4(vt_lane + np * 16 * kHalfRow + kk * 16, b);
                for (int h = 0; h < 2; ++h) {
                    float* acc = o[2 * np + h];
                    cute::SM80_16x8x16_F32F16F16F32_TN::fma(acc[0], acc[1], acc[2], acc[3], a[0], a[1], a[2], a[3],
                                                            b[2 * h], b[2 * h + 1],
                                                            acc[0], acc[1], acc[2], acc[3]);
                }
            }
        }
        bar_arrive(kVtEmptyBar, kThreads);
    }

    // Row sums: each warp of the pair holds its own slots' share; add them in a fixed order.
    bar_sync(kConsumersBar, kConsumerThreads);
    for (int r = 0; r < 2; ++r) {
        row_sum[r] = quad_sum(row_sum[r]);
        if (tig == 0) pair_s[warp * 16 + gid + 8 * r] = row_sum[r];
    }
    pair_barrier();
    for (int r = 0; r < 2; ++r) {
        const int64_t h = head0 + head_group * 16 + gid + 8 * r;
        if (h >= p.h_q) continue;
        const float sum = pair_s[head_group * 16 + gid + 8 * r] + pair_s[(head_group + kHeadGroups) * 16 + gid + 8 * r];
        const bool empty = row_max[r] == -CUDART_INF_F;
        float denom = sum;
        if (p.attn_sink) denom += exp2f(p.attn_sink[h * p.attn_sink_stride] * kLog2e - row_max[r]);
        const float o_scale = empty ? 0.f : kv_scale / denom;
        uint16_t* out = p.out + t * p.out_stride_s + h * p.out_stride_h + half * (kDv / 2) + 2 * tig;
        for (int j = 0; j < kOTiles; ++j) {
            const __nv_bfloat162 v = __floats2bfloat162_rn(o[j][2 * r] * o_scale, o[j][2 * r + 1] * o_scale);
            *reinterpret_cast<__nv_bfloat162*>(out + 8 * j) = v;
        }
        if (half == 0 && tig == 0) {
            p.max_logits[t * p.max_logits_stride_s + h * p.max_logits_stride_h] =
                empty ? -CUDART_INF_F : row_max[r] * kLn2;
            p.lse[t * p.lse_stride_s + h * p.lse_stride_h] =
                empty ? CUDART_INF_F : (row_max[r] + log2f(sum)) * kLn2;
        }
    }
}

}  // namespace sparse_mla::sm90
