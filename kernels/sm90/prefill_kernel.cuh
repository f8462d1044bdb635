// The SM90 FP8 sparse MLA prefill kernel, one template for every QK head dim.
//
// One CTA computes one query token for 64 heads. Eight warps: warp w owns the 16 heads
// (w % 4) * 16.. and the half (w / 4) of d_v. Per tile of 64 topk slots:
//   1. the slots' kv rows are gathered into shared memory (invalid slots: zero rows, -inf bias);
//   2. the V part is converted to fp16 and transposed, because the tensor cores want the slot
//      dimension contiguous for P.V;
//   3. S = Q K^T with FP8 mma.sync (m16n8k32); each 32-wide K step starts from zero and is added
//      into fp32 registers, since the tensor core's own FP8 accumulation keeps too few bits for lse;
//   4. online softmax in base 2; P (fp16, in [0, 1]) times V^T with fp16 mma.sync into fp32 O.
// Both warps of a head group compute the same S: cheaper to write than a shared-memory exchange.
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

__device__ inline uint32_t load_u32(const uint8_t* p) { return *reinterpret_cast<const uint32_t*>(p); }

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
    constexpr int kChunks = D / 16;
    constexpr int kRow = fp8_row_bytes(D);
    constexpr int kVtRow = vt_row_halves();
    constexpr int kSTiles = kSlotsPerTile / 8;      // n8 tiles of S per warp
    constexpr int kOTiles = kDv / 2 / 8;            // n8 tiles of O per warp

    extern __shared__ __align__(128) uint8_t smem[];
    uint8_t* q_s = smem + q_smem_offset(D);
    uint8_t* k_s = smem + k_smem_offset(D);
    uint16_t* vt_s = reinterpret_cast<uint16_t*>(smem + vt_smem_offset(D));
    int32_t* slot_row = reinterpret_cast<int32_t*>(smem + slot_smem_offset(D));
    float* slot_bias = reinterpret_cast<float*>(slot_row + kSlotsPerTile);

    const int tid = threadIdx.x, lane = tid % 32, warp = tid / 32;
    const int gid = lane / 4, tig = lane % 4;
    const int head_group = warp % 4, dv_half = warp / 4;
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

    for (int u = tid; u < kHeadsPerCta * kChunks; u += kThreads) {
        const int r = u / kChunks, c = u % kChunks;
        const bool valid = head0 + r < p.h_q;
        const uint8_t* src = valid ? p.q + t * p.q_stride_s + (head0 + r) * p.q_stride_h + c * 16 : p.q;
        copy_chunk(q_s + r * kRow + c * 16, src, valid, p.rows_16b_aligned);
    }

    float o[kOTiles][4];
    for (int j = 0; j < kOTiles; ++j)
        for (int i = 0; i < 4; ++i) o[j][i] = 0.f;
    float row_max[2] = {-CUDART_INF_F, -CUDART_INF_F};  // base-2 logits of rows gid and gid + 8
    float row_sum[2] = {0.f, 0.f};                       // this thread's share, reduced at the end

    const int32_t* idx_row = p.indices + t * p.indices_stride_s;
    for (int64_t slot0 = 0; slot0 < n_slots; slot0 += kSlotsPerTile) {
        if (tid < kSlotsPerTile) {
            const int64_t slot = slot0 + tid;
            const int32_t j = slot < n_slots ? idx_row[slot] : -1;
            const bool valid = j >= 0 && j < p.s_kv;
            slot_row[tid] = valid ? j : -1;
            slot_bias[tid] = valid ? 0.f : -CUDART_INF_F;
        }
        __syncthreads();

        for (int u = tid; u < kSlotsPerTile * kChunks; u += kThreads) {
            const int r = u / kChunks, c = u % kChunks;
            const int32_t j = slot_row[r];
            const uint8_t* src = j >= 0 ? p.kv + j * p.kv_stride_s + c * 16 : p.kv;
            copy_chunk(k_s + r * kRow + c * 16, src, j >= 0, p.rows_16b_aligned);
        }
        cute::cp_async_wait<0>();
        __syncthreads();

        for (int u = tid; u < kSlotsPerTile * (kDv / 4); u += kThreads) {
            const int s = u % kSlotsPerTile, c = (u / kSlotsPerTile) * 4;
            const uint32_t four = load_u32(k_s + s * kRow + c);
            const __half2_raw lo = __nv_cvt_fp8x2_to_halfraw2(four & 0xffffu, __NV_E4M3);
            const __half2_raw hi = __nv_cvt_fp8x2_to_halfraw2(four >> 16, __NV_E4M3);
            vt_s[(c + 0) * kVtRow + s] = lo.x;
            vt_s[(c + 1) * kVtRow + s] = lo.y;
            vt_s[(c + 2) * kVtRow + s] = hi.x;
            vt_s[(c + 3) * kVtRow + s] = hi.y;
        }
        __syncthreads();

        // S = Q K^T for this warp's 16 heads and the tile's 64 slots.
        float s[kSTiles][4];
        for (int j = 0; j < kSTiles; ++j)
            for (int i = 0; i < 4; ++i) s[j][i] = 0.f;
        const uint8_t* q_w = q_s + (head_group * 16 + gid) * kRow + 4 * tig;
#pragma unroll 2
        for (int k = 0; k < D; k += 32) {
            const uint32_t a0 = load_u32(q_w + k), a1 = load_u32(q_w + 8 * kRow + k);
            const uint32_t a2 = load_u32(q_w + k + 16), a3 = load_u32(q_w + 8 * kRow + k + 16);
#pragma unroll
            for (int j = 0; j < kSTiles; ++j) {
                const uint8_t* k_r = k_s + (8 * j + gid) * kRow + 4 * tig + k;
                float d[4];
                cute::SM89_16x8x32_F32E4M3E4M3F32_TN::fma(d[0], d[1], d[2], d[3], a0, a1, a2, a3,
                                                          load_u32(k_r), load_u32(k_r + 16),
                                                          0.f, 0.f, 0.f, 0.f);
                for (int i = 0; i < 4; ++i) s[j][i] += d[i];
            }
        }

        // Online softmax, base 2. Element i of tile j is row gid + 8 * (i / 2), slot 8j + 2 tig + i % 2.
        float tile_max[2] = {-CUDART_INF_F, -CUDART_INF_F};
        for (int j = 0; j < kSTiles; ++j)
            for (int i = 0; i < 4; ++i) {
                s[j][i] = s[j][i] * logit_scale + slot_bias[8 * j + 2 * tig + i % 2];
                tile_max[i / 2] = fmaxf(tile_max[i / 2], s[j][i]);
            }
        float shift[2];
        for (int r = 0; r < 2; ++r) {
            const float new_max = fmaxf(row_max[r], quad_max(tile_max[r]));
            shift[r] = new_max == -CUDART_INF_F ? 0.f : new_max;  // all slots so far invalid
            const float alpha = exp2f(row_max[r] - shift[r]);
            row_max[r] = new_max;
            row_sum[r] *= alpha;
            for (int j = 0; j < kOTiles; ++j) {
                o[j][2 * r] *= alpha;
                o[j][2 * r + 1] *= alpha;
            }
        }
        for (int j = 0; j < kSTiles; ++j)
            for (int i = 0; i < 4; ++i) {
                s[j][i] = exp2f(s[j][i] - shift[i / 2]);
                row_sum[i / 2] += s[j][i];
            }

        // O += P V: A fragments straight from the S registers, B fragments by ldmatrix from V^T.
#pragma unroll
        for (int kk = 0; kk < kSlotsPerTile / 16; ++kk) {
            const uint32_t a0 = pack_half2(s[2 * kk][0], s[2 * kk][1]);
            const uint32_t a1 = pack_half2(s[2 * kk][2], s[2 * kk][3]);
            const uint32_t a2 = pack_half2(s[2 * kk + 1][0], s[2 * kk + 1][1]);
            const uint32_t a3 = pack_half2(s[2 * kk + 1][2], s[2 * kk + 1][3]);
            const int mat = lane / 8;
            const uint16_t* vt_lane = vt_s + (dv_half * (kDv / 2) + (mat / 2) * 8 + lane % 8) * kVtRow
                                      + kk * 16 + (mat % 2) * 8;
#pragma unroll
            for (int np = 0; np < kOTiles / 2; ++np) {
                uint32_t b[4];
                cute::SM75_U32x4_LDSM_N::copy(*reinterpret_cast<const cute::uint128_t*>(vt_lane + np * 16 * kVtRow),
                                              b[0], b[1], b[2], b[3]);
                for (int h = 0; h < 2; ++h) {
                    float* acc = o[2 * np + h];
                    cute::SM80_16x8x16_F32F16F16F32_TN::fma(acc[0], acc[1], acc[2], acc[3], a0, a1, a2, a3,
                                                            b[2 * h], b[2 * h + 1],
                                                            acc[0], acc[1], acc[2], acc[3]);
                }
            }
        }
        __syncthreads();  // the next tile overwrites k_s, vt_s and the slot table
    }
    cute::cp_async_wait<0>();  // Q copies are still in flight when no tile ran

    for (int r = 0; r < 2; ++r) {
        const int64_t h = head0 + head_group * 16 + gid + 8 * r;
        const float sum = quad_sum(row_sum[r]);
        if (h >= p.h_q) continue;
        const bool empty = row_max[r] == -CUDART_INF_F;
        float denom = sum;
        if (p.attn_sink) denom += exp2f(p.attn_sink[h * p.attn_sink_stride] * kLog2e - row_max[r]);
        const float o_scale = empty ? 0.f : kv_scale / denom;
        uint16_t* out = p.out + t * p.out_stride_s + h * p.out_stride_h + dv_half * (kDv / 2) + 2 * tig;
        for (int j = 0; j < kOTiles; ++j) {
            const __nv_bfloat162 v = __floats2bfloat162_rn(o[j][2 * r] * o_scale, o[j][2 * r + 1] * o_scale);
            *reinterpret_cast<__nv_bfloat162*>(out + 8 * j) = v;
        }
        if (dv_half == 0 && tig == 0) {
            p.max_logits[t * p.max_logits_stride_s + h * p.max_logits_stride_h] =
                empty ? -CUDART_INF_F : row_max[r] * kLn2;
            p.lse[t * p.lse_stride_s + h * p.lse_stride_h] =
                empty ? CUDART_INF_F : (row_max[r] + log2f(sum)) * kLn2;
        }
    }
}

}  // namespace sparse_mla::sm90
