// The SM90 FP8 sparse MLA prefill kernel, one template for every QK head dim.
//
// One CTA computes one query token for 64 heads with two warpgroups. Per tile of 64 topk slots:
//   1. the next tile's kv rows are gathered (cp.async) while this tile is computed; invalid slots
//      become zero rows with a -inf logit, and are never read;
//   2. S = Q K^T by FP8 wgmma, each warpgroup on its 32 slots; each 32-wide K step is summed by the
//      tensor core from zero and added into fp32 registers, since the tensor core's own FP8
//      accumulation across steps keeps too few bits for lse (measured: 3e-3 off with 4 steps chained);
//   3. the V part of the tile is converted to fp16 by all threads (FP8 wgmma wants a K-major B,
//      which for V would need a byte transpose; fp16 wgmma reads V as it lies, MN-major);
//   4. online softmax in base 2, the row maxima exchanged between the warpgroups; P (fp16, in
//      [0, 1], which keeps out's error near bf16 rounding) goes through shared memory, and each
//      warpgroup multiplies all 64 slots by its half of V with fp16 wgmma.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_fp8.h>
#include <math_constants.h>

#include <cute/arch/copy_sm80.hpp>
#include <cute/atom/mma_traits_sm90_gmma.hpp>
#include <cute/tensor.hpp>

#include "params.h"
#include "sm90/config.h"

namespace sparse_mla::sm90 {

constexpr float kLog2e = 1.4426950408889634f;
constexpr float kLn2 = 0.6931471805599453f;

template <int D>
struct SmemLayouts {
    using fp8 = cute::float_e4m3_t;
    using f16 = cute::half_t;
    using Q = decltype(cute::tile_to_shape(cute::GMMA::Layout_K_SW64_Atom<fp8>{},
                                           cute::Shape<cute::Int<kHeadsPerCta>, cute::Int<D>>{}));
    using Kv = decltype(cute::tile_to_shape(cute::GMMA::Layout_K_SW64_Atom<fp8>{},
                                            cute::Shape<cute::Int<kSlotsPerTile>, cute::Int<D>>{}));
    // V as the B operand of P.V: (d_v, slot), d_v contiguous.
    using V = decltype(cute::tile_to_shape(cute::GMMA::Layout_MN_SW128_Atom<f16>{},
                                           cute::Shape<cute::Int<kDv>, cute::Int<kSlotsPerTile>>{}));
    using P = decltype(cute::tile_to_shape(cute::GMMA::Layout_K_SW128_Atom<f16>{},
                                           cute::Shape<cute::Int<kHeadsPerCta>, cute::Int<kSlotsPerTile>>{}));
};

using MmaQK = decltype(cute::make_tiled_mma(cute::SM90_64x32x32_F32E4M3E4M3_SS_TN<>{}));
using MmaPV = decltype(cute::make_tiled_mma(
    cute::SM90_64x256x16_F32F16F16_SS<cute::GMMA::Major::K, cute::GMMA::Major::MN>{}));

// 16 bytes of a row into shared memory; zeros when !valid, and then src is never dereferenced.
__device__ inline void copy_chunk(void* dst, const uint8_t* src, bool valid, bool aligned) {
    if (aligned) {
        using Copy = cute::SM80_CP_ASYNC_CACHEGLOBAL_ZFILL<cute::uint128_t>;
        Copy::copy(*reinterpret_cast<const cute::uint128_t*>(src), *reinterpret_cast<cute::uint128_t*>(dst), valid);
    } else if (valid) {
        for (int i = 0; i < 16; ++i) static_cast<uint8_t*>(dst)[i] = src[i];
    } else {
        for (int i = 0; i < 16; ++i) static_cast<uint8_t*>(dst)[i] = 0;
    }
}

// Generic-proxy writes to shared memory (cp.async, st.shared) before wgmma reads them.
__device__ inline void fence_for_tensor_cores() { asm volatile("fence.proxy.async.shared::cta;" ::: "memory"); }

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

// A wgmma accumulator of a warpgroup: element i of a thread is row 16 warp + gid + 8 ((i / 2) % 2),
// column 8 (i / 4) + 2 tig + i % 2 (the same per warp as mma.sync's m16n8 tiles).
__device__ inline int acc_row(int i) { return (i / 2) % 2; }
__device__ inline int acc_col(int i, int tig) { return 8 * (i / 4) + 2 * tig + i % 2; }

template <int D>
__device__ void prefill(const SparseMlaParams& p) {
    using namespace cute;
    using L = SmemLayouts<D>;
    static_assert(D % 64 == 0 && D >= kDv, "d_qk must be a multiple of 64 (K steps go in pairs) and hold d_v");
    constexpr int kChunks = D / 16;                    // 16-byte chunks of an fp8 row
    constexpr int kSlotsPerWg = kSlotsPerTile / kWarpgroups;
    constexpr int kDvPerWg = kDv / kWarpgroups;
    constexpr int kKSteps = D / 32;                    // wgmma K steps of QK^T, taken in pairs

    extern __shared__ __align__(1024) uint8_t smem[];
    Tensor sQ = make_tensor(make_smem_ptr(reinterpret_cast<float_e4m3_t*>(smem + q_smem_offset(D))), typename L::Q{});
    Tensor sV = make_tensor(make_smem_ptr(reinterpret_cast<half_t*>(smem + v_smem_offset(D))), typename L::V{});
    Tensor sP = make_tensor(make_smem_ptr(reinterpret_cast<half_t*>(smem + p_smem_offset(D))), typename L::P{});
    auto kv_tile = [&](int64_t tile) {
        return make_tensor(make_smem_ptr(reinterpret_cast<float_e4m3_t*>(
                               smem + kv_smem_offset(D) + (tile % kKvStages) * kv_tile_bytes(D))),
                           typename L::Kv{});
    };
    // kv row of each slot, -1 where the slot is invalid
    auto slot_rows = reinterpret_cast<int32_t (*)[kSlotsPerTile]>(smem + slots_smem_offset(D));
    auto row_share = reinterpret_cast<float (*)[kHeadsPerCta]>(smem + rows_smem_offset(D));

    const int tid = threadIdx.x, wg = tid / 128, wg_tid = tid % 128;
    const int lane = tid % 32, gid = lane / 4, tig = lane % 4;
    const int row0 = 16 * (wg_tid / 32) + gid;  // this thread's rows: row0 and row0 + 8
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

    auto fill_slot_table = [&](int64_t tile) {
        if (tid < kSlotsPerTile && tile < n_tiles) {
            const int64_t slot = tile * kSlotsPerTile + tid;
            const int32_t j = slot < n_slots ? idx_row[slot] : -1;
            slot_rows[tile % kSlotTables][tid] = j >= 0 && j < p.s_kv ? j : -1;
        }
    };
    auto gather = [&](int64_t tile) {
        const int32_t* rows = slot_rows[tile % kSlotTables];
        Tensor sKv = kv_tile(tile);
        for (int u = tid; u < kSlotsPerTile * kChunks; u += kThreads) {
            const int r = u / kChunks, c = u % kChunks;
            const int32_t j = rows[r];
            const uint8_t* src = j >= 0 ? p.kv + j * p.kv_stride_s + c * 16 : p.kv;
            copy_chunk(&sKv(r, c * 16), src, j >= 0, p.rows_16b_aligned);
        }
    };

    for (int u = tid; u < kHeadsPerCta * kChunks; u += kThreads) {
        const int r = u / kChunks, c = u % kChunks;
        const bool valid = head0 + r < p.h_q;
        const uint8_t* src = valid ? p.q + t * p.q_stride_s + (head0 + r) * p.q_stride_h + c * 16 : p.q;
        copy_chunk(&sQ(r, c * 16), src, valid, p.rows_16b_aligned);
    }
    fill_slot_table(0);
    fill_slot_table(1);
    __syncthreads();
    if (n_tiles > 0) gather(0);

    MmaQK mma_qk;
    MmaPV mma_pv;
    auto thr_qk = mma_qk.get_thread_slice(wg_tid);
    auto thr_pv = mma_pv.get_thread_slice(wg_tid);
    Tensor tSrQ = thr_qk.partition_fragment_A(sQ);
    Tensor tOrP = thr_pv.partition_fragment_A(sP);
    Tensor tOrV = thr_pv.partition_fragment_B(local_tile(sV, Shape<Int<kDvPerWg>, Int<kSlotsPerTile>>{}, make_coord(wg, 0)));
    Tensor s = partition_fragment_C(mma_qk, Shape<Int<kHeadsPerCta>, Int<kSlotsPerWg>>{});
    using SFragment = decltype(partition_fragment_C(mma_qk, Shape<Int<kHeadsPerCta>, Int<kSlotsPerWg>>{}));
    SFragment step[2];  // two K steps in flight, each in its own accumulator
    Tensor o = partition_fragment_C(mma_pv, Shape<Int<kHeadsPerCta>, Int<kDvPerWg>>{});
    clear(o);
    float row_max[2] = {-CUDART_INF_F, -CUDART_INF_F};  // base-2 logits of rows row0 and row0 + 8
    float row_sum[2] = {0.f, 0.f};                       // over this thread's slots, reduced at the end

    for (int64_t tile = 0; tile < n_tiles; ++tile) {
        cute::cp_async_wait<0>();
        fence_for_tensor_cores();
        __syncthreads();  // this tile's rows have landed; everyone is done with the previous tile
        if (tile + 1 < n_tiles) gather(tile + 1);
        fill_slot_table(tile + 2);
        Tensor sKv = kv_tile(tile);
        const int32_t* rows = slot_rows[tile % kSlotTables];

        // S = Q K^T on this warpgroup's slots. Every K step starts from zero in its own accumulator
        // and is added into fp32 registers: chaining steps inside the tensor core loses ~1e-3 of lse.
        Tensor tSrK = thr_qk.partition_fragment_B(local_tile(sKv, Shape<Int<kSlotsPerWg>, Int<D>>{}, make_coord(wg, 0)));
        clear(s);
        mma_qk.accumulate_ = GMMA::ScaleOut::Zero;
        CUTE_UNROLL
        for (int k = 0; k < kKSteps; k += 2) {
            warpgroup_fence_operand(step[0]);
            warpgroup_fence_operand(step[1]);
            warpgroup_arrive();
            gemm(mma_qk, tSrQ(_, _, k), tSrK(_, _, k), step[0]);
            gemm(mma_qk, tSrQ(_, _, k + 1), tSrK(_, _, k + 1), step[1]);
            warpgroup_commit_batch();
            warpgroup_wait<0>();
            warpgroup_fence_operand(step[0]);
            warpgroup_fence_operand(step[1]);
            CUTE_UNROLL
            for (int i = 0; i < size(s); ++i) s(i) += step[0](i) + step[1](i);
        }

        // V (the first d_v bytes of each row) to fp16, d_v-major: 8 columns of one slot per unit.
        for (int u = tid; u < kSlotsPerTile * (kDv / 8); u += kThreads) {
            const int c = (u % (kDv / 8)) * 8, slot = u / (kDv / 8);
            const uint2 bytes = *reinterpret_cast<const uint2*>(&sKv(slot, c));
            uint4 halves;
            halves.x = e4m3x2_to_half2(bytes.x);
            halves.y = e4m3x2_to_half2(bytes.x >> 16);
            halves.z = e4m3x2_to_half2(bytes.y);
            halves.w = e4m3x2_to_half2(bytes.y >> 16);
            *reinterpret_cast<uint4*>(&sV(c, slot)) = halves;
        }

        // Online softmax, base 2; this warpgroup's slot of element i is 32 wg + acc_col(i).
        float tile_max[2] = {-CUDART_INF_F, -CUDART_INF_F};
        CUTE_UNROLL
        for (int i = 0; i < size(s); ++i) {
            const int slot = kSlotsPerWg * wg + acc_col(i, tig);
            s(i) = rows[slot] >= 0 ? s(i) * logit_scale : -CUDART_INF_F;
            tile_max[acc_row(i)] = fmaxf(tile_max[acc_row(i)], s(i));
        }
        for (int r = 0; r < 2; ++r) {
            tile_max[r] = quad_max(tile_max[r]);
            if (tig == 0) row_share[wg][row0 + 8 * r] = tile_max[r];
        }
        fence_for_tensor_cores();  // V
        __syncthreads();           // V complete; both warpgroups' tile maxima posted
        float shift[2];
        for (int r = 0; r < 2; ++r) {
            // fmaxf is symmetric, so both warpgroups get the same maximum bit for bit.
            const float new_max = fmaxf(row_max[r], fmaxf(tile_max[r], row_share[wg ^ 1][row0 + 8 * r]));
            shift[r] = new_max == -CUDART_INF_F ? 0.f : new_max;  // all slots so far invalid
            const float alpha = exp2f(row_max[r] - shift[r]);
            row_max[r] = new_max;
            row_sum[r] *= alpha;
            CUTE_UNROLL
            for (int i = 0; i < size(o); ++i)
                if (acc_row(i) == r) o(i) *= alpha;
        }
        CUTE_UNROLL
        for (int i = 0; i < size(s); i += 2) {
            const float p0 = exp2f(s(i) - shift[acc_row(i)]), p1 = exp2f(s(i + 1) - shift[acc_row(i)]);
            row_sum[acc_row(i)] += p0 + p1;
            const int slot = kSlotsPerWg * wg + acc_col(i, tig);
            *reinterpret_cast<uint32_t*>(&sP(row0 + 8 * acc_row(i), slot)) = pack_half2(p0, p1);
        }
        fence_for_tensor_cores();  // P
        __syncthreads();           // P complete

        // O += P V: all 64 slots, this warpgroup's half of d_v.
        warpgroup_fence_operand(o);
        warpgroup_arrive();
        CUTE_UNROLL
        for (int k = 0; k < size<2>(tOrP); ++k) gemm(mma_pv, tOrP(_, _, k), tOrV(_, _, k), o);
        warpgroup_commit_batch();
        warpgroup_wait<0>();
        warpgroup_fence_operand(o);
    }
    cute::cp_async_wait<0>();  // Q copies are still in flight when no tile ran

    // Row sums: each warpgroup holds its own slots' share; add them in a fixed order.
    __syncthreads();
    for (int r = 0; r < 2; ++r) {
        row_sum[r] = quad_sum(row_sum[r]);
        if (tig == 0) row_share[wg][row0 + 8 * r] = row_sum[r];
    }
    __syncthreads();
    for (int r = 0; r < 2; ++r) {
        const int64_t h = head0 + row0 + 8 * r;
        if (h >= p.h_q) continue;
        const float sum = row_share[0][row0 + 8 * r] + row_share[1][row0 + 8 * r];
        const bool empty = row_max[r] == -CUDART_INF_F;
        float denom = sum;
        if (p.attn_sink) denom += exp2f(p.attn_sink[h * p.attn_sink_stride] * kLog2e - row_max[r]);
        const float o_scale = empty ? 0.f : kv_scale / denom;
        uint16_t* out = p.out + t * p.out_stride_s + h * p.out_stride_h + wg * kDvPerWg;
        CUTE_UNROLL
        for (int i = 0; i < size(o); i += 2) {
            if (acc_row(i) != r) continue;
            const __nv_bfloat162 v = __floats2bfloat162_rn(o(i) * o_scale, o(i + 1) * o_scale);
            *reinterpret_cast<__nv_bfloat162*>(out + acc_col(i, tig)) = v;
        }
        if (wg == 0 && tig == 0) {
            p.max_logits[t * p.max_logits_stride_s + h * p.max_logits_stride_h] =
                empty ? -CUDART_INF_F : row_max[r] * kLn2;
            p.lse[t * p.lse_stride_s + h * p.lse_stride_h] =
                empty ? CUDART_INF_F : (row_max[r] + log2f(sum)) * kLn2;
        }
    }
}

}  // namespace sparse_mla::sm90
