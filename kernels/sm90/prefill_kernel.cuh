// The SM90 FP8 sparse MLA prefill kernel, one template for every QK head dim.
//
// One CTA computes one query token for 64 heads: a producer warpgroup and two consumer warpgroups,
// meeting on named barriers. Per tile of 64 topk slots:
//   1. the producer gathers the e4m3 kv rows (cp.async, in two halves so that one half lands while
//      the other is converted) into a landing tile; invalid slots become zero rows with a -inf logit;
//   2. the producer converts the tile to fp16 once, into a 128-byte-swizzled [slot][d_qk] tile. Read
//      K-major it is the B of QK^T; read MN-major (the same bytes) its first 512 columns are the B of
//      P.V: no transpose. e4m3 -> fp16 is exact, and fp16 wgmma sums exactly in fp32, where FP8 wgmma
//      does not (PERF.md: it misses the 1e-3 bound on lse and max_logits);
//   3. S = Q K^T by fp16 wgmma m64n64, split along d_qk: each consumer warpgroup sums its half of
//      the K steps over all 64 slots (Q stays in shared memory as e4m3 in the order of the A
//      fragments and is converted in registers each K step), and the two hand each other the
//      partial sums of the other's 32 slots through shared memory;
//   4. online softmax in base 2 on each warpgroup's 32 slots, the row maxima exchanged; P (fp16, in
//      [0, 1]) goes into the tile's columns past d_v, and each warpgroup multiplies all 64 slots
//      by its half of d_v.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_fp8.h>
#include <math_constants.h>

#include <utility>

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
    using f16 = cute::half_t;
    // A kv tile as K of QK^T: (slot, d_qk), d_qk contiguous.
    using K = decltype(cute::tile_to_shape(cute::GMMA::Layout_K_SW128_Atom<f16>{},
                                           cute::Shape<cute::Int<kSlotsPerTile>, cute::Int<kv16_cols(D)>>{}));
    // The same bytes as V of P.V: (d_v, slot), d_v contiguous; atoms along the slots first, as in K.
    using V = decltype(cute::tile_to_shape(cute::GMMA::Layout_MN_SW128_Atom<f16>{},
                                           cute::Shape<cute::Int<kDv>, cute::Int<kSlotsPerTile>>{},
                                           cute::Step<cute::_2, cute::_1>{}));
    // P of a tile, [head][slot]: the same atoms as K's columns [kDv, kDv + 64) (p_offset), which
    // first carry warpgroup 1's partial sums of S.
    using P = decltype(cute::tile_to_shape(cute::GMMA::Layout_K_SW128_Atom<f16>{},
                                           cute::Shape<cute::Int<kHeadsPerCta>, cute::Int<kSlotsPerTile>>{}));
    static constexpr int p_offset = K{}(0, kDv);
    static_assert(kHeadsPerCta == kSlotsPerTile, "P of a tile fills the K tile's atom column");
};

using MmaQK = cute::SM90_64x64x16_F32F16F16_RS<cute::GMMA::Major::K, cute::GMMA::Major::K>;
using MmaPV = decltype(cute::make_tiled_mma(
    cute::SM90_64x256x16_F32F16F16_SS<cute::GMMA::Major::K, cute::GMMA::Major::MN>{}));

// One register-A wgmma on an accumulator of sizeof...(I) floats.
template <class Op, class Acc, size_t... I>
__device__ inline void wgmma_rs(const uint32_t (&a)[4], uint64_t desc, Acc& d, cute::GMMA::ScaleOut scale,
                                std::index_sequence<I...>) {
    Op::fma(a[0], a[1], a[2], a[3], desc, d[I]..., scale);
}

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

// Named barriers (0 is __syncthreads). A full/empty pair orders a buffer between the producer, which
// arrives on "full" and waits on "empty", and the consumers, which do the opposite.
enum Barrier : int {
    kConsumersBar = 1,
    kFullBar0,  // + buffer
    kEmptyBar0 = kFullBar0 + kKvBuffers,
    kProducersBar = kEmptyBar0 + kKvBuffers,
};
static_assert(kProducersBar < 16, "sm_90 has 16 named barriers");

__device__ inline void bar_sync(int id, int threads) {
    asm volatile("bar.sync %0, %1;" ::"r"(id), "r"(threads) : "memory");
}
__device__ inline void bar_arrive(int id, int threads) {
    asm volatile("bar.arrive %0, %1;" ::"r"(id), "r"(threads) : "memory");
}

// Generic-proxy writes to shared memory (st.shared) before wgmma reads them.
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

// Byte offset of fp16 element (row, col) in a 1024-byte-aligned K-major tile of 64-column swizzle
// atoms (GMMA's 128-byte swizzle: address bits 4-6 ^= bits 7-9). CuTe applies that swizzle to the
// pointer, so a layout called on its own gives the offset without it.
__device__ inline uint32_t sw128_byte(int row, int col) {
    return row * 128 + ((((col / 8) ^ (row % 8)) * 16) | (col % 8) * 2);
}

// A wgmma accumulator or A fragment of a warpgroup: element i of a thread is row 16 warp + gid +
// 8 ((i / 2) % 2), column 8 (i / 4) + 2 tig + i % 2 (per warp, the layout of mma.sync's m16n8 tiles).
__device__ inline int acc_row(int i) { return (i / 2) % 2; }
__device__ inline int acc_col(int i, int tig) { return 8 * (i / 4) + 2 * tig + i % 2; }

template <int D>
__device__ void prefill(const SparseMlaParams& p) {
    using namespace cute;
    using L = SmemLayouts<D>;
    static_assert(D % 64 == 0 && D >= kDv, "d_qk must be a multiple of 64 (128-byte fp16 rows) and hold d_v");
    constexpr int kChunks = D / 16;          // 16-byte chunks of an e4m3 row
    constexpr int kKSteps = D / kKStep;
    constexpr int kHalfSlots = kSlotsPerTile / 2;
    constexpr int kDvPerWg = kDv / kConsumerWarpgroups;
    static_assert(smem_bytes(D) <= 227 * 1024, "shared memory of one SM90 CTA");

    extern __shared__ __align__(1024) uint8_t smem[];
    auto kv16 = [&](int buffer) {
        return reinterpret_cast<half_t*>(smem + kv16_smem_offset(D) + buffer * kv16_tile_bytes(D));
    };
    uint8_t* landing = smem + landing_smem_offset(D);
    uint2* q_frag = reinterpret_cast<uint2*>(smem + qfrag_smem_offset(D));
    // kv row of each slot of the tiles being gathered (-1: invalid), and validity of each fp16 tile's slots
    auto slot_rows = reinterpret_cast<int32_t (*)[kSlotsPerTile]>(smem + rows_smem_offset(D));
    auto slot_valid = reinterpret_cast<int32_t (*)[kSlotsPerTile]>(smem + valid_smem_offset(D));
    auto row_share = reinterpret_cast<float (*)[kHeadsPerCta]>(smem + share_smem_offset(D));

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
        // A half tile is 32 rows of kChunks 16-byte chunks; a thread owns one row, and in it the
        // chunks ptid % 4 + 4 m: 64 fp8 bytes apart in the landing row, one swizzle atom (64 fp16
        // columns) apart in the fp16 tile, so that a single address per row serves every m.
        constexpr int kThreadsPerRow = kProducerThreads / kHalfSlots;
        constexpr int kChunksPerThread = kChunks / kThreadsPerRow;
        static_assert(kThreadsPerRow * 16 * 2 == 128, "a row's threads cover one 128-byte fp16 swizzle atom row");
        const int row = ptid / kThreadsPerRow, part = ptid % kThreadsPerRow;
        constexpr int kAtomColumnBytes = kSlotsPerTile * 128;  // between the tile's 64-column swizzle atoms
        static_assert(typename L::K{}(0, 64) * sizeof(half_t) == kAtomColumnBytes, "atom columns of the fp16 tile");

        // Each row's kv index is loaded one tile ahead of its use, so the load's latency is hidden.
        auto raw_index = [&](int64_t tile) {
            const int64_t slot = tile * kSlotsPerTile + ptid;
            return ptid < kSlotsPerTile && slot < n_slots ? idx_row[slot] : -1;
        };
        auto set_slot_row = [&](int64_t tile, int32_t j) {
            if (ptid < kSlotsPerTile) slot_rows[tile % kKvBuffers][ptid] = j >= 0 && j < p.s_kv ? j : -1;
        };
        auto gather_half = [&](int64_t tile, int half) {
            const int slot = half * kHalfSlots + row;
            const int32_t j = slot_rows[tile % kKvBuffers][slot];
            uint8_t* dst = landing + slot * D + 16 * part;
            const uint8_t* src = p.kv + (j >= 0 ? j * p.kv_stride_s + 16 * part : 0);
#pragma unroll
            for (int m = 0; m < kChunksPerThread; ++m)
                copy_chunk(dst + 64 * m, j >= 0 ? src + 64 * m : src, j >= 0, p.rows_16b_aligned);
            cute::cp_async_fence();
        };
        auto convert_half = [&](int buffer, int half) {
            const int slot = half * kHalfSlots + row;
            const uint8_t* src = landing + slot * D + 16 * part;
            // the row's two 16-byte pieces of fp16 columns 16 part .. + 15 in atom column 0 (plain
            // shared addresses: CuTe's swizzled pointers would become generic stores)
            uint8_t* tile = reinterpret_cast<uint8_t*>(kv16(buffer));
            uint8_t* lo = tile + sw128_byte(slot, 16 * part);
            uint8_t* hi = tile + sw128_byte(slot, 16 * part + 8);
            // a group's loads first, so that their latencies overlap (all of them would spill)
            constexpr int kGroup = 2;
#pragma unroll
            for (int m0 = 0; m0 < kChunksPerThread; m0 += kGroup) {
                uint4 e4m3[kGroup];
#pragma unroll
                for (int m = m0; m < m0 + kGroup && m < kChunksPerThread; ++m)
                    e4m3[m - m0] = *reinterpret_cast<const uint4*>(src + 64 * m);
#pragma unroll
                for (int m = m0; m < m0 + kGroup && m < kChunksPerThread; ++m) {
                    const uint32_t w[4] = {e4m3[m - m0].x, e4m3[m - m0].y, e4m3[m - m0].z, e4m3[m - m0].w};
                    uint32_t h[8];
#pragma unroll
                    for (int i = 0; i < 8; ++i) h[i] = e4m3x2_to_half2(w[i / 2] >> (16 * (i % 2)));
                    *reinterpret_cast<uint4*>(lo + m * kAtomColumnBytes) = make_uint4(h[0], h[1], h[2], h[3]);
                    *reinterpret_cast<uint4*>(hi + m * kAtomColumnBytes) = make_uint4(h[4], h[5], h[6], h[7]);
                }
            }
        };

        // The landing tile has two halves; a half of tile i + 1 is gathered as soon as the same half
        // of tile i is converted. Every arrival of the consumers is waited for exactly once.
        int32_t next_index = -1;  // of this thread's slot in the tile after the next
        if (n_tiles > 0) {
            set_slot_row(0, raw_index(0));
            next_index = raw_index(1);
            bar_sync(kProducersBar, kProducerThreads);
            gather_half(0, 0);
            gather_half(0, 1);
        }
        for (int64_t tile = 0; tile < n_tiles; ++tile) {
            const int buffer = tile % kKvBuffers;
            set_slot_row(tile + 1, next_index);
            next_index = raw_index(tile + 2);
            // buffer 1 first holds the consumers' Q rows; then P.V of tile - 2 reads it
            if (tile >= 1) bar_sync(kEmptyBar0 + buffer, kThreads);
            if (ptid < kSlotsPerTile) slot_valid[buffer][ptid] = slot_rows[buffer][ptid] >= 0;
            for (int half = 0; half < 2; ++half) {
                cute::cp_async_wait<1>();
                bar_sync(kProducersBar, kProducerThreads);  // this half landed, from every thread
                convert_half(buffer, half);
                bar_sync(kProducersBar, kProducerThreads);  // this half read by every thread
                if (tile + 1 < n_tiles) {
                    gather_half(tile + 1, half);
                } else {
                    cute::cp_async_fence();  // an empty group keeps the wait counts uniform
                }
            }
            fence_for_tensor_cores();
            bar_arrive(kFullBar0 + buffer, kThreads);
        }
        bar_sync(kEmptyBar0 + 1, kThreads);
        if (n_tiles >= 1) bar_sync(kEmptyBar0, kThreads);
        return;
    }

    asm volatile("setmaxnreg.inc.sync.aligned.u32 %0;" ::"n"(kConsumerRegisters));
    const int wg = tid / kWarpgroupThreads, wg_tid = tid % kWarpgroupThreads;
    const int lane = tid % 32, gid = lane / 4, tig = lane % 4;
    const int row0 = 16 * (wg_tid / 32) + gid;  // this thread's rows: row0 and row0 + 8

    // Q: rows into kv buffer 1, which the producer fills only after the consumers release it, then
    // into A-fragment order, so that a K step of Q is one 8-byte load per thread.
    {
        uint8_t* q_rows = reinterpret_cast<uint8_t*>(kv16(1));
        for (int u = tid; u < kHeadsPerCta * kChunks; u += kConsumerThreads) {
            const int r = u / kChunks, c = u % kChunks;
            const bool valid = head0 + r < p.h_q;
            const uint8_t* src = valid ? p.q + t * p.q_stride_s + (head0 + r) * p.q_stride_h + c * 16 : p.q;
            copy_chunk(q_rows + r * D + c * 16, src, valid, p.rows_16b_aligned);
        }
        cute::cp_async_wait<0>();
        bar_sync(kConsumersBar, kConsumerThreads);
        for (int ks = wg; ks < kKSteps; ks += kConsumerWarpgroups) {
            const uint8_t* lo = q_rows + row0 * D + kKStep * ks + 2 * tig;  // row0
            const uint8_t* hi = lo + 8 * D;                                  // row0 + 8
            auto pair = [](const uint8_t* x) { return static_cast<uint32_t>(*reinterpret_cast<const uint16_t*>(x)); };
            q_frag[ks * kWarpgroupThreads + wg_tid] = make_uint2(pair(lo) | pair(hi) << 16, pair(lo + 8) | pair(hi + 8) << 16);
        }
        bar_sync(kConsumersBar, kConsumerThreads);
        bar_arrive(kEmptyBar0 + 1, kThreads);
    }

    MmaPV mma_pv;
    auto thr_pv = mma_pv.get_thread_slice(wg_tid);
    Tensor o = partition_fragment_C(mma_pv, Shape<Int<kHeadsPerCta>, Int<kDvPerWg>>{});
    clear(o);
    auto mma_qk = make_tiled_mma(MmaQK{});
    auto thr_qk = mma_qk.get_thread_slice(wg_tid);
    float row_max[2] = {-CUDART_INF_F, -CUDART_INF_F};  // running max (base-2 logits) of rows row0, row0 + 8
    float row_sum[2] = {0.f, 0.f};                       // over this warpgroup's own slots, reduced at the end

    // The running max moves to new_max: O and the row sums are rescaled; shift is what the exponents
    // subtract (0 while every slot so far is invalid). Both warpgroups compute it from the same
    // values, so they agree bit for bit.
    auto move_max = [&](const float (&new_max)[2], float (&shift)[2]) {
        for (int r = 0; r < 2; ++r) {
            shift[r] = new_max[r] == -CUDART_INF_F ? 0.f : new_max[r];
            const float alpha = exp2f(row_max[r] - shift[r]);
            row_max[r] = new_max[r];
            row_sum[r] *= alpha;
            CUTE_UNROLL
            for (int i = 0; i < size(o); ++i)
                if (acc_row(i) == r) o(i) *= alpha;
        }
    };
    // O += P V on this warpgroup's half of d_v, issued without waiting; P from the tile's buffer.
    auto pv = [&](int buffer) {
        Tensor sV = make_tensor(make_smem_ptr(kv16(buffer)), typename L::V{});
        Tensor sP = make_tensor(make_smem_ptr(kv16(buffer) + L::p_offset), typename L::P{});
        Tensor tOrP = thr_pv.partition_fragment_A(sP);
        Tensor tOdV = thr_pv.partition_fragment_B(local_tile(sV, Shape<Int<kDvPerWg>, Int<kSlotsPerTile>>{}, make_coord(wg, 0)));
        warpgroup_fence_operand(o);
        warpgroup_arrive();
        CUTE_UNROLL
        for (int k = 0; k < size<2>(tOrP); ++k) gemm(mma_pv, tOrP(_, _, k), tOdV(_, _, k), o);
        warpgroup_commit_batch();
    };

    // Every tile is shared: S = Q K^T is split along d_qk (each warpgroup sums its half of the K
    // steps over all 64 slots, m64n64) and the partial sums are exchanged, so that each warpgroup
    // has S of its own 32 slots; after the softmax both multiply all 64 slots of P by their half of V.
    constexpr int kKStepsPerWg = kKSteps / kConsumerWarpgroups;
    static_assert(kKStepsPerWg % kQkBatch == 0, "QK^T K steps come in whole batches per warpgroup");
    for (int64_t tile = 0; tile < n_tiles; ++tile) {
        const int buffer = tile % kKvBuffers;
        bar_sync(kFullBar0 + buffer, kThreads);
        float acc[kSlotsPerTile / 2];
        {
            Tensor sK = make_tensor(make_smem_ptr(kv16(buffer)), typename L::K{});
            // One descriptor for the tile; a K step adds its byte offset (>> 4, the descriptor's
            // address unit), so that no descriptor per K step is held in registers.
            const uint64_t k_desc = static_cast<uint64_t>(
                thr_qk.partition_fragment_B(local_tile(sK, Shape<Int<kSlotsPerTile>, Int<D>>{}, make_coord(0, 0)))(0, 0, 0));
            // A batch's Q fragments stay in registers until its wgmmas have read them: two batches
            // in flight, each with its own registers.
            auto qk_batch = [&](uint32_t (&a)[kQkBatch][4], uint32_t (&a_prev)[kQkBatch][4], int batch) {
                const int ks0 = wg * kKStepsPerWg + batch * kQkBatch;  // this batch's first K step
                CUTE_UNROLL
                for (int j = 0; j < kQkBatch; ++j) {
                    const uint2 e4m3 = q_frag[(ks0 + j) * kWarpgroupThreads + wg_tid];
                    a[j][0] = e4m3x2_to_half2(e4m3.x);
                    a[j][1] = e4m3x2_to_half2(e4m3.x >> 16);
                    a[j][2] = e4m3x2_to_half2(e4m3.y);
                    a[j][3] = e4m3x2_to_half2(e4m3.y >> 16);
                }
                CUTE_UNROLL
                for (int i = 0; i < kSlotsPerTile / 2; ++i) warpgroup_fence_operand(acc[i]);
                warpgroup_arrive();
                CUTE_UNROLL
                for (int j = 0; j < kQkBatch; ++j) {
                    const uint64_t desc = k_desc + typename L::K{}(0, (ks0 + j) * kKStep) * sizeof(half_t) / 16;
                    wgmma_rs<MmaQK>(a[j], desc, acc, batch + j == 0 ? GMMA::ScaleOut::Zero : GMMA::ScaleOut::One,
                                    std::make_index_sequence<kSlotsPerTile / 2>{});
                }
                warpgroup_commit_batch();
                warpgroup_wait<1>();
                // the previous batch is done: only now may its A registers be reused
                CUTE_UNROLL
                for (int j = 0; j < kQkBatch; ++j)
                    for (int k = 0; k < 4; ++k) warpgroup_fence_operand(a_prev[j][k]);
            };
            uint32_t a_even[kQkBatch][4], a_odd[kQkBatch][4];
            CUTE_UNROLL
            for (int batch = 0; batch < kKStepsPerWg / kQkBatch; batch += 2) {
                qk_batch(a_even, a_odd, batch);
                if (batch + 1 < kKStepsPerWg / kQkBatch) qk_batch(a_odd, a_even, batch + 1);
            }
            warpgroup_wait<0>();
            CUTE_UNROLL
            for (int i = 0; i < kSlotsPerTile / 2; ++i) warpgroup_fence_operand(acc[i]);
            CUTE_UNROLL
            for (int j = 0; j < kQkBatch; ++j)
                for (int k = 0; k < 4; ++k) warpgroup_fence_operand(a_even[j][k]), warpgroup_fence_operand(a_odd[j][k]);
        }

        // Hand the peer the partial sums of its slots (element i of this thread's 16 is at the same
        // (row, slot) in both warpgroups; float4 j of thread t goes to [j][t]): warpgroup 0 through
        // a region of its own, warpgroup 1 through the tile's columns past d_v, which only it reads
        // in QK^T, and where P goes once both have read (after the row-max barrier).
        const uint32_t xchg_wg0 = static_cast<uint32_t>(__cvta_generic_to_shared(smem + xchg_smem_offset(D)));
        const uint32_t xchg_wg1 = static_cast<uint32_t>(__cvta_generic_to_shared(kv16(buffer) + L::p_offset));
        // (selects with constant indices: a register array indexed at run time would go to memory)
        auto part = [&](bool upper, int i) { return upper ? acc[kSlotsPerTile / 4 + i] : acc[i]; };
        {
            const uint32_t to_peer = (wg == 0 ? xchg_wg0 : xchg_wg1) + 16 * wg_tid;
            CUTE_UNROLL
            for (int j = 0; j < kSlotsPerTile / 16; ++j)
                asm volatile("st.shared.v4.f32 [%0], {%1, %2, %3, %4};" ::"r"(to_peer + j * 16 * kWarpgroupThreads),
                             "f"(part(wg == 0, 4 * j)), "f"(part(wg == 0, 4 * j + 1)),
                             "f"(part(wg == 0, 4 * j + 2)), "f"(part(wg == 0, 4 * j + 3)) : "memory");
        }
        bar_sync(kConsumersBar, kConsumerThreads);  // both halves of d_qk posted
        float s[kSlotsPerTile / 4];
        {
            const uint32_t from_peer = (wg == 0 ? xchg_wg1 : xchg_wg0) + 16 * wg_tid;
            CUTE_UNROLL
            for (int j = 0; j < kSlotsPerTile / 16; ++j) {
                float x[4];
                asm volatile("ld.shared.v4.f32 {%0, %1, %2, %3}, [%4];" : "=f"(x[0]), "=f"(x[1]), "=f"(x[2]), "=f"(x[3])
                             : "r"(from_peer + j * 16 * kWarpgroupThreads) : "memory");
                for (int k = 0; k < 4; ++k) s[4 * j + k] = part(wg == 1, 4 * j + k) + x[k];
            }
        }

        // Online softmax, base 2; this warpgroup's slot of element i is 32 wg + acc_col(i).
        const int32_t* valid = slot_valid[buffer];
        float tile_max[2] = {-CUDART_INF_F, -CUDART_INF_F};
        CUTE_UNROLL
        for (int i = 0; i < kSlotsPerTile / 4; ++i) {
            const int slot = kSlotsPerTile / 2 * wg + acc_col(i, tig);
            s[i] = valid[slot] ? s[i] * logit_scale : -CUDART_INF_F;
            tile_max[acc_row(i)] = fmaxf(tile_max[acc_row(i)], s[i]);
        }
        for (int r = 0; r < 2; ++r) {
            tile_max[r] = quad_max(tile_max[r]);
            if (tig == 0) row_share[wg][row0 + 8 * r] = tile_max[r];
        }
        bar_sync(kConsumersBar, kConsumerThreads);  // both warpgroups' tile maxima posted; partial sums read
        float new_max[2], shift[2];
        // fmaxf is symmetric, so both warpgroups get the same maximum bit for bit.
        for (int r = 0; r < 2; ++r) new_max[r] = fmaxf(row_max[r], fmaxf(tile_max[r], row_share[wg ^ 1][row0 + 8 * r]));
        move_max(new_max, shift);
        CUTE_UNROLL
        for (int i = 0; i < kSlotsPerTile / 4; i += 2) {
            const float p0 = exp2f(s[i] - shift[acc_row(i)]), p1 = exp2f(s[i + 1] - shift[acc_row(i)]);
            row_sum[acc_row(i)] += p0 + p1;
            const uint32_t at = xchg_wg1 + sw128_byte(row0 + 8 * acc_row(i), kSlotsPerTile / 2 * wg + acc_col(i, tig));
            asm volatile("st.shared.b32 [%0], %1;" ::"r"(at), "r"(pack_half2(p0, p1)) : "memory");
        }
        fence_for_tensor_cores();
        bar_sync(kConsumersBar, kConsumerThreads);  // P complete

        pv(buffer);
        warpgroup_wait<0>();
        warpgroup_fence_operand(o);
        bar_arrive(kEmptyBar0 + buffer, kThreads);
    }

    // Row sums: each warpgroup holds its own slots' share; add them in a fixed order.
    bar_sync(kConsumersBar, kConsumerThreads);
    for (int r = 0; r < 2; ++r) {
        row_sum[r] = quad_sum(row_sum[r]);
        if (tig == 0) row_share[wg][row0 + 8 * r] = row_sum[r];
    }
    bar_sync(kConsumersBar, kConsumerThreads);
    for (int r = 0; r < 2; ++r) {
        const int64_t h = head0 + row0 + 8 * r;
        if (h >= p.h_q) continue;
        const float sum = row_share[0][row0 + 8 * r] + row_share[1][row0 + 8 * r];
        const bool empty = row_max[r] == -CUDART_INF_F;
        float denom = sum;
        if (p.attn_sink) denom += exp2f(p.attn_sink[h * p.attn_sink_stride] * kLog2e - row_max[r]);
        const float o_scale = empty ? 0.f : kv_scale / denom;
        // one base pointer and constant offsets: 64 addresses held at once would spill
        __nv_bfloat162* out = reinterpret_cast<__nv_bfloat162*>(
            p.out + t * p.out_stride_s + h * p.out_stride_h + wg * kDvPerWg + acc_col(0, tig));
        CUTE_UNROLL
        for (int i = 0; i < size(o); i += 4) {
            const int e = i + 2 * r;  // columns 8 (i / 4) + 2 tig, + 1 of row r
            out[4 * (i / 4)] = __floats2bfloat162_rn(o(e) * o_scale, o(e + 1) * o_scale);
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
