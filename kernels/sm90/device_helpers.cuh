// Device helpers of the SM90 prefill kernels: copies, named barriers, conversions, quad
// shuffles, the swizzled offsets of their shared-memory tiles and the layout of a wgmma accumulator.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <stdint.h>

#include <utility>

#include <cute/arch/copy_sm80.hpp>
#include <cute/atom/mma_traits_sm90_gmma.hpp>
#include <cute/tensor.hpp>

#include "sm90/config.h"

namespace sparse_mla::sm90 {

// The swizzled layouts of the shared-memory operands, one per operand:
// an e4m3 tile of kRows rows x d_qk (Q: 64 heads; a landing tile: its slots), d_qk contiguous, in
// 64-byte swizzle atoms: the K-major A and B of QK^T;
template <int kRows, int D>
using E4m3Tile = decltype(cute::tile_to_shape(cute::GMMA::Layout_K_SW64_Atom<cute::float_e4m3_t>{},
                                              cute::Shape<cute::Int<kRows>, cute::Int<D>>{}));
// the fp16 tile of kSlots slots as V of P.V: (d_v, slot), d_v contiguous, atoms along the slots
// first: the MN-major B.
template <int kSlots>
using V16Tile = decltype(cute::tile_to_shape(cute::GMMA::Layout_MN_SW128_Atom<cute::half_t>{},
                                             cute::Shape<cute::Int<kDv>, cute::Int<kSlots>>{},
                                             cute::Step<cute::_2, cute::_1>{}));
// precision "fast": the e4m3 V^T of kSlots slots, (d_v, slot) with the slots contiguous, in 32-byte
// swizzle atoms: the K-major B of an FP8 P.V, its K in p_slot order.
template <int kSlots>
using VtTile = decltype(cute::tile_to_shape(cute::GMMA::Layout_K_SW32_Atom<cute::float_e4m3_t>{},
                                            cute::Shape<cute::Int<kDv>, cute::Int<kSlots>>{}));
// Bytes between a row's 16-byte chunks c and c + 4 in an e4m3 tile of kSlotsPerTile rows: one 64-byte
// swizzle atom column (sw64_chunk).
constexpr int kE4m3AtomColumnBytes = kSlotsPerTile * 64;
static_assert(E4m3Tile<kSlotsPerTile, kDv>{}(0, 64) == kE4m3AtomColumnBytes, "64-byte atom columns of an e4m3 tile");

// The slot at K position k (< 32) of an FP8 P.V whose e4m3 P (the A, from registers) a thread makes
// from its own m64n32 S accumulator: A register j holds K positions 4 tig .. 4 tig + 3 (+ 16 for j >= 2)
// where the accumulator holds slots 2 tig, 2 tig + 1, 2 tig + 8, 2 tig + 9 (+ 16); V^T is stored in
// this order, so that P needs no shuffle (FlashAttention-3 permutes P's registers instead).
__host__ __device__ constexpr int p_slot(int k) { return 16 * (k / 16) + 2 * (k % 16 / 4) + k % 2 + 8 * (k % 4 / 2); }
static_assert(p_slot(0) == 0 && p_slot(2) == 8 && p_slot(5) == 3 && p_slot(19) == 25 && p_slot(31) == 31, "P's K order");

constexpr float kLog2e = 1.4426950408889634f;
constexpr float kLn2 = 0.6931471805599453f;

using MmaQK = cute::SM90_64x32x32_F32E4M3E4M3_SS_TN<>;

// The wgmma descriptor of a Q tile (64 heads, an E4m3Tile) as the A of QK^T, for thread wg_tid of its
// warpgroup.
template <int D>
__device__ inline uint64_t q_descriptor(uint8_t* q_tile, int wg_tid) {
    using namespace cute;
    static_assert(D % 64 == 0 && D >= kDv, "d_qk must be a multiple of 64 (whole swizzle atoms) and hold d_v");
    auto thr_qk = make_tiled_mma(MmaQK{}).get_thread_slice(wg_tid);
    return static_cast<uint64_t>(thr_qk.partition_fragment_A(
        make_tensor(make_smem_ptr(reinterpret_cast<float_e4m3_t*>(q_tile)), E4m3Tile<kHeadsPerWg, D>{}))(0, 0, 0));
}

// The wgmma descriptor of half tile `half` (32 slots) of an e4m3 tile of kRows slots (an E4m3Tile) as
// the B of QK^T, for thread wg_tid of its warpgroup.
template <int D, int kRows = kSlotsPerTile>
__device__ inline uint64_t k_descriptor(uint8_t* tile, int half, int wg_tid) {
    using namespace cute;
    auto thr_qk = make_tiled_mma(MmaQK{}).get_thread_slice(wg_tid);
    return static_cast<uint64_t>(thr_qk.partition_fragment_B(local_tile(
        make_tensor(make_smem_ptr(reinterpret_cast<float_e4m3_t*>(tile)), E4m3Tile<kRows, D>{}),
        Shape<Int<kSlotsPerTile / 2>, Int<D>>{}, make_coord(half, 0)))(0, 0, 0));
}

// One shared-memory wgmma on an accumulator of sizeof...(I) floats.
template <class Op, class Acc, size_t... I>
__device__ inline void wgmma_ss(uint64_t desc_a, uint64_t desc_b, Acc& d, cute::GMMA::ScaleOut scale,
                                std::index_sequence<I...>) {
    Op::fma(desc_a, desc_b, d[I]..., scale);
}

// A wgmma descriptor moved by `bytes` in shared memory: only the start address moves, in the
// descriptor's low word (addresses >> 4 < 2^14: no carry); the high word stays.
__device__ inline uint64_t desc_plus(uint64_t desc, uint32_t bytes) {
    uint64_t d;
    asm("mov.b64 %0, {%1, %2};" : "=l"(d) : "r"(static_cast<uint32_t>(desc) + bytes / 16), "r"(static_cast<uint32_t>(desc >> 32)));
    return d;
}

// A K step of an e4m3 tile's wgmma descriptor (Q or a landing tile). (kRows: the tile's rows, 64
// heads or kSlotsPerTile slots, or a 32-slot tile's.)
template <int D, int kRows>
__device__ inline uint64_t at_k_step(uint64_t desc, int ks) {
    return desc_plus(desc, static_cast<uint32_t>(E4m3Tile<kRows, D>{}(0, ks * kKStep)));
}

// What qk_promoted issues inside its K steps when the P.V before it is waited for whole: nothing.
struct NoPvPiece {
    __device__ void operator()(int) const {}
};

// S = Q K^T of 64 heads x 32 slots over all of d_qk by FP8 wgmma (m64n32k32), promoted per K step:
// each step's wgmma starts from zero into one of kQkSets register sets and is added into s in fp32
// while the next two run (the tensor cores keep only ~14 bits of a sum; PERF.md). Precision "fast"
// lets the tensor cores sum kStepsPerSum K steps before each promotion (CONTRACT.md); below, a "K
// step" is then such a sum. The P.V before it takes one of two ways:
//   - kPvPieces == 0: it was issued whole, before. after_wait() runs at the third K step, after a
//     wait for every wgmma of the warpgroup, so also for that P.V (ptxas serializes the wgmmas when
//     a P.V issued whole is waited for with a partial count);
//   - otherwise (one K step per sum) pv_piece(i) issues its wgmma i into the commit group of K step
//     kPvPieceStride i + 2, where it keeps the tensor cores busy between K steps instead of holding
//     the first K steps back (PERF-HISTORY.md, v22; ptxas serializes every wgmma for some other
//     steps). after_wait() runs once the wait of a K step has covered the last piece.
// kKRows: the rows of the tile that k_desc names (Q has 64).
template <int D, int kKRows = kSlotsPerTile, int kPvPieces = 0, int kStepsPerSum = 1, int kAcc, class AfterWait,
          class PvPiece = NoPvPiece>
__device__ inline void qk_promoted(uint64_t q_desc, uint64_t k_desc, float (&s)[kAcc], AfterWait after_wait,
                                   PvPiece pv_piece = {}) {
    static_assert(D / kKStep % kStepsPerSum == 0, "whole sums of K steps");
    static_assert(kPvPieces == 0 || kStepsPerSum == 1, "P.V pieces placed between single K steps only");
    constexpr int kKSteps = D / kKStep / kStepsPerSum;
    constexpr int kPvPieceStride = 4, kPvFirstStep = 2;
    // the K step whose wait (two steps on) covers the last piece, or the third
    constexpr int kAfterWaitStep = kPvPieces == 0 ? 2 : kPvPieceStride * (kPvPieces - 1) + kPvFirstStep + 2;
    static_assert(kQkSets == 3 && kKSteps > kQkSets, "the waits below keep two K steps running");
    static_assert(kAfterWaitStep <= kKSteps, "every P.V piece is waited for inside QK^T");
    float part[kQkSets][kAcc];
    auto issue = [&](int ks) {
        CUTE_UNROLL
        for (int i = 0; i < kAcc; ++i) cute::warpgroup_fence_operand(part[ks % kQkSets][i]);
        cute::warpgroup_arrive();
        CUTE_UNROLL
        for (int k = kStepsPerSum * ks; k < kStepsPerSum * (ks + 1); ++k)
            wgmma_ss<MmaQK>(at_k_step<D, kHeadsPerWg>(q_desc, k), at_k_step<D, kKRows>(k_desc, k), part[ks % kQkSets],
                            k == kStepsPerSum * ks ? cute::GMMA::ScaleOut::Zero : cute::GMMA::ScaleOut::One,
                            std::make_index_sequence<kAcc>{});
        if (ks % kPvPieceStride == kPvFirstStep && ks / kPvPieceStride < kPvPieces) pv_piece(ks / kPvPieceStride);
        cute::warpgroup_commit_batch();
    };
    auto add = [&](int ks) {
        CUTE_UNROLL
        for (int i = 0; i < kAcc; ++i) {
            cute::warpgroup_fence_operand(part[ks % kQkSets][i]);
            s[i] += part[ks % kQkSets][i];
        }
    };
    issue(0);
    issue(1);
    CUTE_UNROLL
    for (int ks = 2; ks <= kKSteps; ++ks) {
        if (ks < kKSteps) issue(ks);
        if (ks == 2 && kPvPieces == 0) {
            cute::warpgroup_wait<0>();
        } else if (ks < kKSteps) {
            cute::warpgroup_wait<2>();
        } else {
            cute::warpgroup_wait<1>();
        }
        if (ks == kAfterWaitStep) after_wait();
        add(ks - 2);
    }
    cute::warpgroup_wait<0>();
    add(kKSteps - 1);
}

// 16 bytes from global memory to the shared-window address dst by cp.async (L2 prefetch of 128
// bytes); zeros when !valid, and then src is never dereferenced.
__device__ inline void cp_async_16(uint32_t dst, const uint8_t* src, bool valid) {
    asm volatile("cp.async.cg.shared.global.L2::128B [%0], [%1], 16, %2;" ::"r"(dst), "l"(src), "r"(valid ? 16 : 0) : "memory");
}

// One of four threads' share of an e4m3 row: its kChunks 16-byte chunks, 64 bytes apart in the row from
// src and kColumnBytes (a swizzle atom column) apart in the tile from dst, by cp.async into the shared
// window; zeros when !valid (src is then not read).
template <int kChunks, int kColumnBytes>
__device__ inline void cp_async_row_share(uint32_t dst, const uint8_t* src, bool valid) {
#pragma unroll
    for (int m = 0; m < kChunks; ++m) cp_async_16(dst + m * kColumnBytes, src + 64 * m, valid);
}

// 16 bytes of a row into shared memory; zeros when !valid, and then src is never dereferenced.
__device__ inline void copy_chunk(uint8_t* dst, const uint8_t* src, bool valid, bool aligned) {
    if (aligned) {
        cp_async_16(static_cast<uint32_t>(__cvta_generic_to_shared(dst)), src, valid);
    } else if (valid) {
        for (int i = 0; i < 16; ++i) dst[i] = src[i];
    } else {
        for (int i = 0; i < 16; ++i) dst[i] = 0;
    }
}

// cp_async_row_share by byte copies, for rows that are not 16-byte aligned (rare: kept a loop).
template <int kChunks, int kColumnBytes>
__device__ inline void copy_row_share(uint8_t* dst, const uint8_t* src, bool valid) {
    for (int m = 0; m < kChunks; ++m) copy_chunk(dst + m * kColumnBytes, src + 64 * m, valid, false);
}

// 8 bytes into global memory (dst 8-byte aligned) by one store. A uint2 store beside a branch that
// writes the same two words one by one came out as two 4-byte stores (narrow16/32's out rows: every
// sector written in two halves, PERF.md v12).
__device__ inline void st_global_v2(void* dst, uint32_t lo, uint32_t hi) {
    asm volatile("st.global.v2.b32 [%0], {%1, %2};" ::"l"(dst), "r"(lo), "r"(hi) : "memory");
}

// 16 bytes of a row from global memory.
__device__ inline uint4 load_chunk(const uint8_t* src, bool aligned) {
    if (aligned) return __ldg(reinterpret_cast<const uint4*>(src));
    uint32_t w[4] = {};
#pragma unroll
    for (int i = 0; i < 16; ++i) w[i / 4] |= static_cast<uint32_t>(src[i]) << (8 * (i % 4));
    return make_uint4(w[0], w[1], w[2], w[3]);
}

// A quad's share of an e4m3 row for an exact dot product: thread tig's 16-byte chunks tig + 4 m.
// aligned may be a compile-time constant (std::true_type), which leaves no branch per chunk.
template <int N, class Aligned>
__device__ inline void load_quad_share(uint4 (&dst)[N], const uint8_t* row, int tig, Aligned aligned) {
#pragma unroll
    for (int m = 0; m < N; ++m) dst[m] = load_chunk(row + 16 * (tig + 4 * m), aligned);
}

__device__ inline void bar_sync(int id, int threads) {
    asm volatile("bar.sync %0, %1;" ::"r"(id), "r"(threads) : "memory");
}
__device__ inline void bar_arrive(int id, int threads) {
    asm volatile("bar.arrive %0, %1;" ::"r"(id), "r"(threads) : "memory");
}

// mbarriers: a thread's arrival (release), one once its cp.async copies so far have landed, and a
// wait for a phase (acquire).
__device__ inline uint32_t smem_u32(const void* p) { return static_cast<uint32_t>(__cvta_generic_to_shared(p)); }

__device__ inline void mbar_init(uint64_t* bar, int count) {
    asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;" ::"r"(smem_u32(bar)), "r"(count) : "memory");
}
__device__ inline void mbar_arrive(uint64_t* bar) {
    asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];" ::"r"(smem_u32(bar)) : "memory");
}
// (the arrival is one of the count: .noinc)
__device__ inline void mbar_arrive_on_copies(uint64_t* bar) {
    asm volatile("cp.async.mbarrier.arrive.noinc.shared::cta.b64 [%0];" ::"r"(smem_u32(bar)) : "memory");
}
__device__ inline void mbar_wait(uint64_t* bar, uint32_t parity) {
    asm volatile(
        "{\n .reg .pred done;\n wait:\n"
        " mbarrier.try_wait.parity.shared::cta.b64 done, [%0], %1;\n"
        " @!done bra wait;\n}" ::"r"(smem_u32(bar)), "r"(parity) : "memory");
}

// Four 8 x 8 matrices of b16 from shared memory (ldmatrix): lane l gives the address of row l % 8 of
// matrix l / 8; register j receives elements (l / 4, 2 (l % 4)) and (l / 4, 2 (l % 4) + 1) of matrix
// j, the first in the low half; transposed (.trans), elements (2 (l % 4), l / 4) and (2 (l % 4) + 1, l / 4).
__device__ inline void ldmatrix_x4(uint32_t (&r)[4], uint32_t addr) {
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3]) : "r"(addr));
}
__device__ inline void ldmatrix_x4_trans(uint32_t (&r)[4], uint32_t addr) {
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0, %1, %2, %3}, [%4];"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3]) : "r"(addr));
}
// Four 8 x 8 matrices of b16 into shared memory (stmatrix): lane l gives the address of row l % 8 of
// matrix l / 8; register j of lane l goes to elements (l / 4, 2 (l % 4)) and (l / 4, 2 (l % 4) + 1)
// of matrix j.
__device__ inline void stmatrix_x4(uint32_t addr, const uint32_t (&r)[4]) {
    asm volatile("stmatrix.sync.aligned.m8n8.x4.shared.b16 [%0], {%1, %2, %3, %4};" ::"r"(addr), "r"(r[0]), "r"(r[1]),
                 "r"(r[2]), "r"(r[3])
                 : "memory");
}
// Generic-proxy writes to shared memory (st.shared, cp.async) before wgmma reads them.
__device__ inline void fence_for_tensor_cores() { asm volatile("fence.proxy.async.shared::cta;" ::: "memory"); }

// Four e4m3 to two half2 (bytes 0-1, then 2-3). The conversions take the word's halves as 16-bit
// registers, which ptxas reads in place (R.H0, R.H1): no shift per pair, which in the producer's V
// conversion is 64 instructions per thread and tile.
__device__ inline uint2 e4m3x4_to_half2x2(uint32_t four) {
    uint2 h;
    asm("{\n .reg .b16 lo, hi;\n mov.b32 {lo, hi}, %2;\n cvt.rn.f16x2.e4m3x2 %0, lo;\n cvt.rn.f16x2.e4m3x2 %1, hi;\n}"
        : "=r"(h.x), "=r"(h.y) : "r"(four));
    return h;
}

__device__ inline uint32_t pack_half2(float lo, float hi) {
    __half2 h = __floats2half2_rn(lo, hi);
    return *reinterpret_cast<uint32_t*>(&h);
}

// Sum of the products of 16 e4m3 pairs, in fp32 (each product is exact), in a fixed order.
__device__ inline float dot_e4m3x16(uint4 a, uint4 b, float acc) {
    const uint32_t wa[4] = {a.x, a.y, a.z, a.w}, wb[4] = {b.x, b.y, b.z, b.w};
#pragma unroll
    for (int j = 0; j < 4; ++j) {
        const uint2 ha = e4m3x4_to_half2x2(wa[j]), hb = e4m3x4_to_half2x2(wb[j]);
        const uint32_t xa[2] = {ha.x, ha.y}, xb[2] = {hb.x, hb.y};
#pragma unroll
        for (int k = 0; k < 2; ++k) {
            const float2 x = __half22float2(*reinterpret_cast<const __half2*>(&xa[k]));
            const float2 y = __half22float2(*reinterpret_cast<const __half2*>(&xb[k]));
            acc = fmaf(x.x, y.x, acc);
            acc = fmaf(x.y, y.y, acc);
        }
    }
    return acc;
}

// floor(log2(a / b)) for positive normal a and b, from their exponents and mantissas: on the fast
// softmax's path, where a division and a log2 would add two MUFU latencies per tile.
__device__ inline int floor_log2_ratio(float a, float b) {
    const int ia = __float_as_int(a), ib = __float_as_int(b);
    return (ia >> 23) - (ib >> 23) - ((ia & 0x7fffff) < (ib & 0x7fffff));
}

__device__ inline float quad_max(float x) {
    x = fmaxf(x, __shfl_xor_sync(0xffffffffu, x, 1));
    return fmaxf(x, __shfl_xor_sync(0xffffffffu, x, 2));
}

// A 4 x 4 transpose of words across a quad (lanes 4 i .. 4 i + 3): lane tig gets word tig of each
// lane, in lane order. Every lane of the warp must call it (full-warp shuffles).
__device__ inline void quad_transpose(uint32_t (&w)[4], int tig) {
    const bool high_pair = tig & 2, odd = tig & 1;
    // the 2 x 2 blocks off the diagonal, with lane tig ^ 2
    uint32_t r0 = __shfl_xor_sync(0xffffffffu, high_pair ? w[0] : w[2], 2);
    uint32_t r1 = __shfl_xor_sync(0xffffffffu, high_pair ? w[1] : w[3], 2);
    if (high_pair) w[0] = r0, w[1] = r1;
    else w[2] = r0, w[3] = r1;
    // then within the blocks, with lane tig ^ 1
    r0 = __shfl_xor_sync(0xffffffffu, odd ? w[0] : w[1], 1);
    r1 = __shfl_xor_sync(0xffffffffu, odd ? w[2] : w[3], 1);
    if (odd) w[0] = r0, w[2] = r1;
    else w[1] = r0, w[3] = r1;
}

__device__ inline float quad_sum(float x) {
    x += __shfl_xor_sync(0xffffffffu, x, 1);
    return x + __shfl_xor_sync(0xffffffffu, x, 2);
}

// A logit with its tile slot (0..63) in the 6 lowest mantissa bits (a relative change below 1e-5),
// so that a maximum of such values says which slot it came from.
constexpr uint32_t kSlotBits = 63;
static_assert(kSlotsPerTile == kSlotBits + 1, "a tile slot fits the low mantissa bits");
__device__ inline float with_slot(float logit, uint32_t slot) {
    return __uint_as_float((__float_as_uint(logit) & ~kSlotBits) | slot);
}

// Byte offset of fp16 element (row, col) in a 1024-byte-aligned K-major tile of 64-column swizzle
// atoms (GMMA's 128-byte swizzle: address bits 4-6 ^= bits 7-9).
__device__ inline uint32_t sw128_byte(uint32_t row, uint32_t col) {
    return row * 128 + ((((col / 8) ^ (row % 8)) * 16) | (col % 8) * 2);
}

// Byte offset of the 16-byte chunk of e4m3 columns 16 c .. 16 c + 15 of a row in an e4m3 tile (rows
// rows, atoms of 64 columns; GMMA's 64-byte swizzle: address bits 4-5 ^= bits 7-8).
__device__ inline uint32_t sw64_chunk(uint32_t row, uint32_t c, uint32_t rows = kSlotsPerTile) {
    return (c / 4) * (rows * 64) + row * 64 + (((c % 4) ^ ((row / 2) % 4)) * 16);
}

// An f16 O of 64 heads x 512 columns (two 256-column wgmma accumulators, f16 pairs): this thread's
// row r (its words j = r mod 2) times alpha.
__device__ inline void scale_f16_row(uint32_t (&o)[2][64], int r, float alpha) {
    const __half2 a2 = __float2half2_rn(alpha);
    CUTE_UNROLL
    for (int n = 0; n < 2; ++n)
        CUTE_UNROLL
        for (int j = r; j < 64; j += 2) {
            __half2 x = *reinterpret_cast<__half2*>(&o[n][j]);
            x = __hmul2(x, a2);
            o[n][j] = *reinterpret_cast<uint32_t*>(&x);
        }
}

// Row r of an output row from a wgmma accumulator (an f16 O's words, an fp32 O's element pairs):
// columns of halves kFirst .. kLast - 1 (256 each) from a thread's words j = r mod 2 of each half n
// (columns 256 n + 8 (j / 2) + 2 tig, + 1), bf16_pair(n, j) giving the pair: with
// 16-byte rows a quad's words of four column groups are transposed so that each thread stores 8
// columns. Every lane of the warp must call it.
template <int kFirst, int kLast, class Pair>
__device__ inline void store_row(uint16_t* out, int r, int tig, bool aligned, bool real, Pair bf16_pair) {
    if (aligned) {
        CUTE_UNROLL
        for (int n = kFirst; n < kLast; ++n)
            CUTE_UNROLL
            for (int j0 = 0; j0 < 64; j0 += 8) {
                uint32_t w[4];
                CUTE_UNROLL
                for (int k = 0; k < 4; ++k) w[k] = bf16_pair(n, j0 + 2 * k + r);
                quad_transpose(w, tig);
                if (real) *reinterpret_cast<uint4*>(out + 256 * n + 4 * j0 + 8 * tig) = make_uint4(w[0], w[1], w[2], w[3]);
            }
    } else if (real) {
        CUTE_UNROLL
        for (int n = kFirst; n < kLast; ++n)
            CUTE_UNROLL
            for (int j = r; j < 64; j += 2) *reinterpret_cast<uint32_t*>(out + 256 * n + 8 * (j / 2) + 2 * tig) = bf16_pair(n, j);
    }
}

__device__ inline uint32_t bf16x2(float lo, float hi) {
    const __nv_bfloat162 b = __floats2bfloat162_rn(lo, hi);
    return *reinterpret_cast<const uint32_t*>(&b);
}

// A wgmma accumulator of a warpgroup: element i of a thread is row 16 warp + gid + 8 ((i / 2) % 2),
// column 8 (i / 4) + 2 tig + i % 2 (per warp, the layout of mma.sync's m16n8 tiles).
__device__ inline int acc_row(int i) { return (i / 2) % 2; }
__device__ inline int acc_col(int i, int tig) { return 8 * (i / 4) + 2 * tig + i % 2; }

}  // namespace sparse_mla::sm90
