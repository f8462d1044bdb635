// The SM90 FP8 sparse MLA prefill kernel, one template for every QK head dim.
//
// One CTA computes one query token for 64 heads: a producer warpgroup and eight consumer warps in 4
// head groups of 16 heads, the two warps of a group splitting each tile's slots for S and the
// columns of d_v for O. They meet on named barriers (a full/empty pair per kv stage). Per tile of
// 64 slots:
//   1. the producer loads the slots' kv rows and converts them once to fp16 (e4m3 is exact in fp16),
//      into a tile that serves both products: K for QK^T, its first d_v columns V for P.V. Invalid
//      slots become zero rows with a -inf logit, and are never read;
//   2. S = Q K^T with fp16 mma.sync: Q stays e4m3 in shared memory and each 32-column fragment is
//      converted once in registers. fp16 products of e4m3 values are exact and the sums fp32, so
//      lse and max_logits are exact to fp32 rounding (FP8 wgmma is not, see PERF.md);
//   3. online softmax in base 2, the row max exchanged within the pair; P (fp16, in [0, 1]) goes
//      through shared memory so that each warp multiplies all 64 slots by its half of V, read from
//      the fp16 tile with ldmatrix.trans.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_fp8.h>
#include <math_constants.h>

#include <cute/arch/copy_sm75.hpp>
#include <cute/arch/copy_sm80.hpp>
#include <cute/arch/mma_sm80.hpp>

#include "params.h"
#include "sm90/config.h"

namespace sparse_mla::sm90 {

constexpr float kLog2e = 1.4426950408889634f;
constexpr float kLn2 = 0.6931471805599453f;

// 16 bytes of a Q row into shared memory; zeros when !valid, and then src is never dereferenced.
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

// 16 bytes of a kv row into registers (zeros when !valid, src then not dereferenced).
__device__ inline uint4 load_chunk(const uint8_t* src, bool valid, bool aligned) {
    uint4 v = make_uint4(0, 0, 0, 0);
    if (valid && aligned) {
        v = __ldg(reinterpret_cast<const uint4*>(src));
    } else if (valid) {
        uint8_t* b = reinterpret_cast<uint8_t*>(&v);
        for (int i = 0; i < 16; ++i) b[i] = src[i];
    }
    return v;
}

__device__ inline void ldsm_x4(const void* p, uint32_t (&r)[4]) {
    cute::SM75_U32x4_LDSM_N::copy(*reinterpret_cast<const cute::uint128_t*>(p), r[0], r[1], r[2], r[3]);
}

__device__ inline void ldsm_x4_trans(const void* p, uint32_t (&r)[4]) {
    cute::SM75_U16x8_LDSM_T::copy(*reinterpret_cast<const cute::uint128_t*>(p), r[0], r[1], r[2], r[3]);
}

__device__ inline void hmma(float (&acc)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1) {
    cute::SM80_16x8x16_F32F16F16F32_TN::fma(acc[0], acc[1], acc[2], acc[3], a[0], a[1], a[2], a[3], b0, b1,
                                            acc[0], acc[1], acc[2], acc[3]);
}

// Named barriers (0 is __syncthreads). A full/empty pair orders a kv stage between the producer,
// which arrives on "full" and waits on "empty", and the consumers, which do the opposite.
enum Barrier : int {
    kConsumersBar = 1,
    kPairBar0 = 2,  // + head group: the two warps of a group
    kKvFullBar0 = kPairBar0 + kHeadGroups,  // + stage
    kKvEmptyBar0 = kKvFullBar0 + kKvStages,
    kProducersBar = kKvEmptyBar0 + kKvStages,
};
static_assert(kProducersBar < 16, "sm_90 has 16 named barriers");

__device__ inline void bar_sync(int id, int threads) {
    asm volatile("bar.sync %0, %1;" ::"r"(id), "r"(threads) : "memory");
}
__device__ inline void bar_arrive(int id, int threads) {
    asm volatile("bar.arrive %0, %1;" ::"r"(id), "r"(threads) : "memory");
}

// Two e4m3 values (the low 16 bits) to an fp16 pair.
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
    constexpr int kQRow = q_row_bytes(D);
    constexpr int kKvRow = kv_row_halves(D);
    constexpr int kPRow = p_row_halves();
    constexpr int kSTiles = kSlotsPerTile / 2 / 8;  // n8 tiles of S per warp: its half of the slots
    constexpr int kOTiles = kDv / 2 / 8;            // n8 tiles of O per warp: its half of d_v
    constexpr int kLoadsPerThread = kSlotsPerTile * kChunks / kProducerThreads;
    static_assert(kSlotsPerTile * kChunks % kProducerThreads == 0, "the producer's loads must divide evenly");

    extern __shared__ __align__(128) uint8_t smem[];
    uint8_t* q_s = smem + q_smem_offset(D);
    uint16_t* kv_s = reinterpret_cast<uint16_t*>(smem + kv_smem_offset(D));
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
        for (int64_t tile = 0; tile < n_tiles; ++tile) {
            const int stage = tile % kKvStages;
            if (tile >= kKvStages) bar_sync(kKvEmptyBar0 + stage, kThreads);  // P.V of tile - 2 is done
            int32_t* rows = slot_rows[stage];
            if (ptid < kSlotsPerTile) {
                const int64_t slot = tile * kSlotsPerTile + ptid;
                const int32_t j = slot < n_slots ? idx_row[slot] : -1;
                rows[ptid] = j >= 0 && j < p.s_kv ? j : -1;
            }
            bar_sync(kProducersBar, kProducerThreads);  // the slot table is written
            uint16_t* kv_tile = kv_s + stage * kv_tile_halves(D);
#pragma unroll 6
            for (int i = 0; i < kLoadsPerThread; ++i) {
                const int u = ptid + i * kProducerThreads, r = u / kChunks, c = u % kChunks;
                const int32_t j = rows[r];
                const uint8_t* src = j >= 0 ? p.kv + j * p.kv_stride_s + c * 16 : p.kv;
                const uint4 v = load_chunk(src, j >= 0, p.rows_16b_aligned);
                const uint32_t w[4] = {v.x, v.y, v.z, v.w};
                uint4 h[2];
                uint32_t* hw = reinterpret_cast<uint32_t*>(h);
#pragma unroll
                for (int k = 0; k < 8; ++k) hw[k] = e4m3x2_to_half2(w[k / 2] >> (16 * (k % 2)));
                uint4* dst = reinterpret_cast<uint4*>(kv_tile + r * kKvRow + c * 16);
                dst[0] = h[0];
                dst[1] = h[1];
            }
            bar_arrive(kKvFullBar0 + stage, kThreads);
        }
        // Every arrival of the consumers is waited for exactly once.
        for (int64_t tile = n_tiles >= kKvStages ? n_tiles - kKvStages : 0; tile < n_tiles; ++tile)
            bar_sync(kKvEmptyBar0 + tile % kKvStages, kThreads);
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
        copy_chunk(q_s + r * kQRow + c * 16, src, valid, p.rows_16b_aligned);
    }
    cute::cp_async_wait<0>();
    bar_sync(kConsumersBar, kConsumerThreads);

    float o[kOTiles][4];
    for (int j = 0; j < kOTiles; ++j)
        for (int i = 0; i < 4; ++i) o[j][i] = 0.f;
    float row_max[2] = {-CUDART_INF_F, -CUDART_INF_F};  // base-2 logits of rows gid and gid + 8
    float row_sum[2] = {0.f, 0.f};                       // over this thread's slots, reduced at the end

    // Q by ldmatrix of e4m3 rows: lane L holds columns 4 (L % 4) .. + 3 of rows gid, gid + 8 for each
    // 16-column half of a 32-column block. QK^T takes K's columns in that same order: in each
    // 16-wide mma step, this lane's k indices 2 tig, 2 tig + 1, 2 tig + 8, 2 tig + 9 are the columns
    // 4 tig .. 4 tig + 3, which one 8-byte load of a K row gives.
    const int quad = lane / 8, row8 = lane % 8;
    const uint8_t* q_lane = q_s + (head_group * 16 + (quad % 2) * 8 + row8) * kQRow + (quad / 2) * 16;
    const int k_thread = (half * (kSlotsPerTile / 2) + gid) * kKvRow + 4 * tig;
    const uint16_t* p_group = p_s + head_group * 16 * kPRow;
    const uint16_t* p_lane = p_group + ((quad % 2) * 8 + row8) * kPRow + (quad / 2) * 8;
    // V (the tile's first d_v columns) by ldmatrix.trans: slot rows, d_v columns.
    const int v_lane = ((quad % 2) * 8 + row8) * kKvRow + half * (kDv / 2) + (quad / 2) * 8;

    for (int64_t tile = 0; tile < n_tiles; ++tile) {
        const int stage = tile % kKvStages;
        bar_sync(kKvFullBar0 + stage, kThreads);
        const uint16_t* kv_tile = kv_s + stage * kv_tile_halves(D);
        const int32_t* rows = slot_rows[stage];

        // S = Q K^T: this warp's 16 heads x its 32 slots.
        float s[kSTiles][4];
        for (int j = 0; j < kSTiles; ++j)
            for (int i = 0; i < 4; ++i) s[j][i] = 0.f;
#pragma unroll 2
        for (int k = 0; k < D; k += 32) {
            uint32_t q8[4];
            ldsm_x4(q_lane + k, q8);
            // A fragments of the two 16-wide steps: rows gid / gid + 8, k pairs (2 tig, 2 tig + 8).
            const uint32_t a_lo[4] = {e4m3x2_to_half2(q8[0]), e4m3x2_to_half2(q8[1]),
                                      e4m3x2_to_half2(q8[0] >> 16), e4m3x2_to_half2(q8[1] >> 16)};
            const uint32_t a_hi[4] = {e4m3x2_to_half2(q8[2]), e4m3x2_to_half2(q8[3]),
                                      e4m3x2_to_half2(q8[2] >> 16), e4m3x2_to_half2(q8[3] >> 16)};
#pragma unroll
            for (int j = 0; j < kSTiles; ++j) {
                const uint16_t* k_row = kv_tile + k_thread + 8 * j * kKvRow + k;
                const uint2 b_lo = *reinterpret_cast<const uint2*>(k_row);
                const uint2 b_hi = *reinterpret_cast<const uint2*>(k_row + 16);
                hmma(s[j], a_lo, b_lo.x, b_lo.y);
                hmma(s[j], a_hi, b_hi.x, b_hi.y);
            }
        }

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
            uint32_t* p_row = reinterpret_cast<uint32_t*>(p_s + (head_group * 16 + gid) * kPRow + col);
            p_row[0] = pack_half2(s[j][0], s[j][1]);
            p_row[8 * kPRow / 2] = pack_half2(s[j][2], s[j][3]);
        }
        pair_barrier();  // the pair's P is complete

        // O += P V: all 64 slots of P, this warp's half of V.
#pragma unroll
        for (int kk = 0; kk < kSlotsPerTile / 16; ++kk) {
            uint32_t a[4];
            ldsm_x4(p_lane + kk * 16, a);
#pragma unroll
            for (int np = 0; np < kOTiles / 2; ++np) {
                uint32_t b[4];
                ldsm_x4_trans(kv_tile + v_lane + kk * 16 * kKvRow + np * 16, b);
                hmma(o[2 * np], a, b[0], b[1]);
                hmma(o[2 * np + 1], a, b[2], b[3]);
            }
        }
        bar_arrive(kKvEmptyBar0 + stage, kThreads);
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
