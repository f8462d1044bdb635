// What the consumer warpgroups of the wide, split and dual kernels share: an O of 64 heads x 512
// columns in f16 registers (two 256-column wgmma accumulators of f16 pairs), fed by P.V with P from
// registers, the online softmax of a half tile (32 slots) that makes that P, and (wide and dual) the
// item's end.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_fp8.h>
#include <math_constants.h>
#include <stdint.h>

#include <type_traits>
#include <utility>

#include <cute/atom/mma_traits_sm90_gmma.hpp>
#include <cute/tensor.hpp>

#include "params.h"
#include "sm90/config.h"
#include "sm90/device_helpers.cuh"
#include "sm90/exact_max.cuh"
#include "sm90/work.cuh"

namespace sparse_mla::sm90 {

using F16O = uint32_t[2][64];

template <class F>
__device__ inline void each_word(F16O& o, F f) {
    CUTE_UNROLL
    for (int n = 0; n < 2; ++n)
        CUTE_UNROLL
        for (int j = 0; j < 64; ++j) f(o[n][j]);
}

using MmaPvF16 = cute::SM90::GMMA::MMA_64x256x16_F16F16F16_RS<cute::GMMA::Major::K, cute::GMMA::Major::MN>;

// O += P V on 256 columns: P (A) from registers, V from shared memory, O in f16.
template <size_t... I>
__device__ inline void wgmma_pv(const uint32_t* a, uint64_t desc_b, uint32_t (&d)[64], std::index_sequence<I...>) {
    MmaPvF16::fma(a[0], a[1], a[2], a[3], desc_b, d[I]..., cute::GMMA::ScaleOut::One);
}

// P.V's B, the fp16 tile's V: a descriptor per 256-column half; a k16 chunk of the slots moves its
// low word by `chunk`.
struct PvOperandB {
    uint64_t desc[2];
    uint32_t chunk;
    // (kSlots: the fp16 tile's slots, kSlotsPerTile or a 32-slot tile's: a V16Tile)
    template <int D, int kSlots = kSlotsPerTile>
    __device__ PvOperandB(uint8_t* v16, int wg_tid, std::integral_constant<int, D>,
                          std::integral_constant<int, kSlots> = {}) {
        using namespace cute;
        auto thr_pv = make_tiled_mma(MmaPvF16{}).get_thread_slice(wg_tid);
        Tensor sV = make_tensor(make_smem_ptr(reinterpret_cast<half_t*>(v16)), V16Tile<kSlots>{});
        CUTE_UNROLL
        for (int n = 0; n < 2; ++n) {
            Tensor t = thr_pv.partition_fragment_B(local_tile(sV, Shape<_256, Int<kSlots>>{}, make_coord(n, 0)));
            desc[n] = static_cast<uint64_t>(t(0, 0, 0));
            chunk = static_cast<uint32_t>(static_cast<uint64_t>(t(0, 0, 1))) - static_cast<uint32_t>(desc[n]);
        }
    }
    __device__ uint64_t at(int n, int k) const {
        uint64_t d;
        asm("mov.b64 %0, {%1, %2};" : "=l"(d) : "r"(static_cast<uint32_t>(desc[n]) + k * chunk), "r"(static_cast<uint32_t>(desc[n] >> 32)));
        return d;
    }
};

// Precision "fast": O += P V on FP8 tensor cores, P (e4m3, A) from registers, V^T (VtTiles of 32
// slots) from shared memory, O in f16: an m64n256k32 wgmma per half tile and 256-column half of O.
using MmaPvE4m3 = cute::SM90::GMMA::MMA_64x256x32_F16E4M3E4M3_RS_TN<>;

template <size_t... I>
__device__ inline void wgmma_pv_e4m3(const uint32_t (&a)[4], uint64_t desc_b, uint32_t (&d)[64], std::index_sequence<I...>) {
    MmaPvE4m3::fma(a[0], a[1], a[2], a[3], desc_b, d[I]..., cute::GMMA::ScaleOut::One);
}

// That P.V's B: the wgmma descriptor of the VtTile (32 slots) at vt, O's first 256 columns; O's
// second 256 are 8 KB on, and VtTiles follow each other 16 KB apart (desc_plus).
__device__ inline uint64_t vt_descriptor(uint8_t* vt, int wg_tid) {
    using namespace cute;
    Tensor sVt = make_tensor(make_smem_ptr(reinterpret_cast<float_e4m3_t*>(vt)), VtTile<kSlotsPerTile / 2>{});
    return static_cast<uint64_t>(make_tiled_mma(MmaPvE4m3{}).get_thread_slice(wg_tid).partition_fragment_B(
        local_tile(sVt, Shape<_256, Int<kSlotsPerTile / 2>>{}, make_coord(0, 0)))(0, 0, 0));
}
constexpr uint32_t kVtHalfOBytes = 256 * kKStep;
static_assert(VtTile<kSlotsPerTile / 2>{}(256, 0) == kVtHalfOBytes, "O's 256-column halves of a VtTile, 8 KB apart");

// O += P V over kHalves half tiles (their VtTiles from vt_desc on, P in an A fragment each), two
// m64n256k32 wgmmas each, into the caller's commit group.
template <int kHalves>
__device__ inline void pv_e4m3(const uint32_t (&pa)[kHalves][4], uint64_t vt_desc, F16O& o) {
    CUTE_UNROLL
    for (int h = 0; h < kHalves; ++h)
        CUTE_UNROLL
        for (int n = 0; n < 2; ++n) {
            CUTE_UNROLL
            for (int j = 0; j < 64; ++j) cute::warpgroup_fence_operand(o[n][j]);
            wgmma_pv_e4m3(pa[h], desc_plus(vt_desc, h * kVtTileBytes + n * kVtHalfOBytes), o[n],
                          std::make_index_sequence<64>{});
        }
}

// P.V of a half tile is kPvPieces wgmmas: its two k16 chunks of slots times O's two 256-column halves.
constexpr int kPvPieces = 4;

// Piece i of O += P V over half tile h (slots 32 h .. 32 h + 31): chunk i / 2 into O's half i % 2,
// issued into the caller's commit group.
__device__ inline void pv_piece(const uint32_t (&pr)[8], const PvOperandB& v, int h, int i, F16O& o) {
    const int c = i / 2, n = i % 2;
    CUTE_UNROLL
    for (int j = 0; j < 64; ++j) cute::warpgroup_fence_operand(o[n][j]);
    wgmma_pv(&pr[4 * c], v.at(n, 2 * h + c), o[n], std::make_index_sequence<64>{});
}

// O += P V over half tile h, issued whole without waiting.
__device__ inline void pv_half(const uint32_t (&pr)[8], const PvOperandB& v, int h, F16O& o) {
    cute::warpgroup_arrive();
    CUTE_UNROLL
    for (int i = 0; i < kPvPieces; ++i) pv_piece(pr, v, h, i, o);
    cute::warpgroup_commit_batch();
}

// The online softmax's state of a thread's two rows: running max (base-2 logits, slot in the low
// bits), the reference that O and the sums are relative to, the row sums, the tile of the max.
struct SoftmaxRows {
    // The reference follows the running max lazily: O and the sums are rescaled only when some row
    // of the warp has a max more than kSlack above its reference, so P stays below 2^kSlack.
    static constexpr float kSlack = 4.f;
    float max[2], ref[2], sum[2];
    int max_tile[2];

    __device__ void reset() {
        for (int r = 0; r < 2; ++r) max[r] = ref[r] = -CUDART_INF_F, sum[r] = 0.f, max_tile[r] = 0;
    }
    __device__ void follow_max(F16O& o) {
        const bool behind = max[0] > ref[0] + kSlack || max[1] > ref[1] + kSlack;
        if (!__any_sync(0xffffffffu, behind)) return;
        CUTE_UNROLL
        for (int r = 0; r < 2; ++r) {
            if (max[r] == -CUDART_INF_F) continue;
            const float alpha = exp2f(ref[r] - max[r]);
            ref[r] = max[r];
            sum[r] *= alpha;
            scale_f16_row(o, r, alpha);
        }
    }
    // S of half tile h of tile `tile` (element i is slot 32 h + acc_col(i); `valid` the half's
    // validity bits, from its slot 0: a word, or more for S of a whole tile, h 0) as base-2 logits
    // with their slots (invalid slots -inf), into the running max. kWithSlots false: no exact max will
    // ask which slot the max is, and the logits keep their low bits (dual_fast).
    template <bool kWithSlots = true, int kAcc, class Valid>
    __device__ void take_half(float (&s)[kAcc], Valid valid, int h, int tile, int tig, float logit_scale) {
        float tile_max[2] = {-CUDART_INF_F, -CUDART_INF_F};
        valid >>= 2 * tig;
        CUTE_UNROLL
        for (int i = 0; i < kAcc; ++i) {
            const float logit = s[i] * logit_scale;
            s[i] = (valid >> acc_col(i, 0)) & 1 ? (kWithSlots ? with_slot(logit, kSlotsPerTile / 2 * h + acc_col(i, tig)) : logit)
                                                : -CUDART_INF_F;
            tile_max[acc_row(i)] = fmaxf(tile_max[acc_row(i)], s[i]);
        }
        CUTE_UNROLL
        for (int r = 0; r < 2; ++r) {
            const float new_max = fmaxf(max[r], quad_max(tile_max[r]));
            if (kWithSlots && new_max > max[r]) max_tile[r] = tile;
            max[r] = new_max;
        }
    }
    // The half tile's S (take_half's) into P in fp16 pairs, scaled by 2^-p_shift.
    template <int kAcc>
    __device__ void softmax_half(float (&s)[kAcc], uint32_t valid, int h, int tile, int tig, float logit_scale,
                                 float p_shift, F16O& o, uint32_t (&pr)[kAcc / 2]) {
        take_half(s, valid, h, tile, tig, logit_scale);
        follow_max(o);
        const float shift[2] = {(ref[0] == -CUDART_INF_F ? 0.f : ref[0]) + p_shift,
                                (ref[1] == -CUDART_INF_F ? 0.f : ref[1]) + p_shift};
        CUTE_UNROLL
        for (int i = 0; i < kAcc; i += 2) {
            const float p0 = exp2f(s[i] - shift[acc_row(i)]), p1 = exp2f(s[i + 1] - shift[acc_row(i)]);
            sum[acc_row(i)] += p0 + p1;
            pr[i / 2] = pack_half2(p0, p1);
        }
    }
    // Precision "fast": S of kAcc / 16 half tiles (32 slots each, from half tile h of tile `tile`:
    // element i is slot 32 h + acc_col(i); `valid` their validity bits) into P = 2^(s - ref) in fp32,
    // in place, for e4m3_p.
    // The reference is the running max less a whole e <= 8, so that the max's P is an exact power of
    // two (a rounded one that dominates its row costs up to 5x SGLang's error) and small P keep their
    // bits; e falls as the row's sum grows, so that O stays below f16's 65504 even were every slot
    // of these half tiles at the max with V at 448 (a static scale from topk loses up to all of out at
    // topk 2048). Where a row's reference moves, O's row is to be rescaled by alpha[r] (the caller
    // does it, once no P.V runs on O; 1 where it stays); returns whether some row of the warp moved.
    // The sums are of P before its rounding. (PERF.md: the float64 simulation behind each choice; at
    // SGLang's error, 0.98-1.09x of it, at topk 128-2048.)
    template <bool kWithSlots = true, int kAcc, class Valid>
    __device__ bool softmax_e4m3(float (&s)[kAcc], Valid valid, int h, int tile, int tig, float logit_scale,
                                 float (&alpha)[2]) {
        static_assert(kAcc % 16 == 0, "whole half tiles: the A of k32 steps");
        static_assert(sizeof(Valid) * 8 >= 2 * kAcc, "a validity bit per slot");
        constexpr int kMaxPBits = 8;  // 2^8 <= e4m3's 448
        // the rows' sum that O may reach: 65504 / 448, less P's rounding (RN, 2^-4) and a margin
        constexpr float kOBudget = 65504.f / (448.f * 1.07f);
        constexpr float kSlots = 2 * kAcc;  // of a row, in these half tiles
        take_half<kWithSlots>(s, valid, h, tile, tig, logit_scale);
        bool behind = false;
        CUTE_UNROLL
        for (int r = 0; r < 2; ++r) {
            const float row_sum = quad_sum(sum[r]);  // relative to 2^ref
            alpha[r] = 1.f;
            if (max[r] == -CUDART_INF_F) continue;
            const float l = ref[r] == -CUDART_INF_F ? 0.f : row_sum * exp2f(ref[r] - max[r]);  // relative to 2^max
            const float need = max[r] - static_cast<float>(::min(kMaxPBits, floor_log2_ratio(kOBudget, l + kSlots)));
            if (need == ref[r]) continue;
            alpha[r] = ref[r] == -CUDART_INF_F ? 0.f : exp2f(ref[r] - need);
            ref[r] = need;
            sum[r] *= alpha[r];
            behind = true;
        }
        const float shift[2] = {ref[0] == -CUDART_INF_F ? 0.f : ref[0], ref[1] == -CUDART_INF_F ? 0.f : ref[1]};
        CUTE_UNROLL
        for (int i = 0; i < kAcc; ++i) {
            s[i] = exp2f(s[i] - shift[acc_row(i)]);
            sum[acc_row(i)] += s[i];
        }
        return __any_sync(0xffffffffu, behind);
    }
};

// Precision "fast": O's rows rescaled as softmax_e4m3 asks (moved: its answer).
__device__ inline void follow_ref(F16O& o, bool moved, const float (&alpha)[2]) {
    if (!moved) return;
    CUTE_UNROLL
    for (int r = 0; r < 2; ++r)
        if (alpha[r] != 1.f) scale_f16_row(o, r, alpha[r]);
}

// Precision "fast": softmax_e4m3's P of kAcc / 16 half tiles in e4m3, the A fragments of FP8 P.V (one
// per half tile, register j: rows j % 2, K positions 16 (j / 2) + 4 tig .. + 3 in p_slot order, i.e.
// elements i, i + 1, i + 4, i + 5 of the accumulator, i = 8 (j / 2) + 2 (j % 2)).
template <int kAcc>
__device__ inline void e4m3_p(const float (&p)[kAcc], uint32_t (&pa)[kAcc / 16][4]) {
    auto e4m3x4 = [](float a, float b, float c, float d) {
        const uint32_t lo = __nv_cvt_float2_to_fp8x2(make_float2(a, b), __NV_SATFINITE, __NV_E4M3);
        const uint32_t hi = __nv_cvt_float2_to_fp8x2(make_float2(c, d), __NV_SATFINITE, __NV_E4M3);
        return lo | hi << 16;
    };
    CUTE_UNROLL
    for (int h = 0; h < kAcc / 16; ++h)
        CUTE_UNROLL
        for (int j = 0; j < 4; ++j) {
            const int i = 16 * h + 8 * (j / 2) + 2 * (j % 2);
            pa[h][j] = e4m3x4(p[i], p[i + 1], p[i + 4], p[i + 5]);
        }
}

// P's scale 2^-p_shift for a warpgroup that sums up to `slots` slots: |O| <= slots x 2^kSlack x
// 2^-p_shift x 448 stays below f16's 65504.
__device__ inline float p_shift_for(int64_t slots) {
    int bits = 0;
    while ((int64_t{1} << bits) < slots) ++bits;
    return SoftmaxRows::kSlack + static_cast<float>(bits > 7 ? bits - 7 : 0);
}

// An item's end for a warpgroup holding all of O of its 64 heads (head0 ..; rows row0 and row0 + 8
// of this thread) in f16: out, then max_logits and lse. The exact max reads its Q rows from q_tile,
// the item's Q tile (an E4m3Tile) (one fewer round trip than global memory: PERF-HISTORY.md, v19):
// into registers once O's are free, then it calls q_read(), after which the caller may load the
// next item's Q there, its copies under the exact max's loads of kv rows and sums; or, q_read
// nullptr, inside the sums, the tile kept until write_item returns. Under precision "fast"
// (kExactMax false) max_logits is the running max as the tensor cores summed it, and nothing is
// recomputed (nor q_read called).
template <int D, bool kExactMax = true, class QRead = std::nullptr_t>
__device__ inline void write_item(const SparseMlaParams& p, const WorkItems& work, const Scales& scale, int64_t t,
                                  int64_t head0, int64_t n_slots, const int32_t* idx_row, const SoftmaxRows& rows,
                                  const F16O& o, float p_shift, int row0, int tig, const uint8_t* q_tile,
                                  QRead q_read = nullptr) {
    constexpr int kChunks = D / 16;  // 16-byte chunks of an e4m3 row
    // out, then max_logits and lse, per row: the running max's slot is recomputed exactly (fp32
    // sums of the e4m3 products) and its exact term replaces its tensor-core one in the sum. The
    // max slots' indices load under the output stores, their rows once O's registers are free.
    float sum[2];
    int32_t j_max[2];
    CUTE_UNROLL
    for (int r = 0; r < 2; ++r) {
        sum[r] = quad_sum(rows.sum[r]);  // in units of 2^-p_shift
        j_max[r] = -1;
        if (kExactMax && head0 + row0 + 8 * r < p.h_q && rows.max[r] != -CUDART_INF_F)
            j_max[r] = max_index(rows.max[r], rows.max_tile[r], n_slots, idx_row);
    }
    struct RowOut {
        bool real;
        float scale;
        uint16_t* out;
    };
    auto row_out = [&](int r) {
        const int64_t h = head0 + row0 + 8 * r;
        const bool real = h < p.h_q;
        float denom = sum[r];
        if (p.attn_sink && real) denom += exp2f(p.attn_sink[h * p.attn_sink_stride] * kLog2e - rows.ref[r] - p_shift);
        return RowOut{real, rows.max[r] == -CUDART_INF_F ? 0.f : scale.kv / denom,
                      p.out + t * p.out_stride_s + (real ? h : 0) * p.out_stride_h};
    };
    // O's 256-column halves first .. last - 1 of row r (cute::_0 ..: compile-time halves)
    auto store = [&](auto first, auto last, int r, const RowOut& x) {
        store_row<decltype(first)::value, decltype(last)::value>(x.out, r, tig, p.out_rows_16b_aligned, x.real, [&](int n, int j) {
            const float2 v = __half22float2(*reinterpret_cast<const __half2*>(&o[n][j]));
            return bf16x2(v.x * x.scale, v.y * x.scale);
        });
    };
    if constexpr (kExactMax) {  // row by row: 1-2% faster here than the order below (PERF.md)
        CUTE_UNROLL
        for (int r = 0; r < 2; ++r) store(cute::_0{}, cute::_2{}, r, row_out(r));
    } else {  // both rows' first 256 columns, then their second: ~1% faster in dual_fast (PERF.md)
        const RowOut x[2] = {row_out(0), row_out(1)};
        CUTE_UNROLL
        for (int r = 0; r < 2; ++r) store(cute::_0{}, cute::_1{}, r, x[r]);
        CUTE_UNROLL
        for (int r = 0; r < 2; ++r) store(cute::_1{}, cute::_2{}, r, x[r]);
    }
    if constexpr (!kExactMax) {
        CUTE_UNROLL
        for (int r = 0; r < 2; ++r) {
            const int64_t h = head0 + row0 + 8 * r;
            if (h < p.h_q && tig == 0)
                write_max_lse(p, t, h, rows.max[r], rows.ref[r] + p_shift, sum[r], rows.max[r] * kLn2,
                              rows.max[r] == -CUDART_INF_F);
        }
        return;
    }
    // both rows' loads at once (O's registers are free now), the quad splitting d_qk; the
    // alignment is decided once, not per chunk (a branch per chunk kept the rows' loads apart).
    constexpr int kChunksPerThread = kChunks / 4;
    uint4 kc[2][kChunksPerThread];
    // a row is read only when it is real and has a valid max slot; otherwise the loads read the
    // token's first q row in its place (unconditional loads keep kc in registers)
    bool exact[2];
    const uint8_t* kv_row[2];
    CUTE_UNROLL
    for (int r = 0; r < 2; ++r) {
        exact[r] = work.in_range(j_max[r]);
        kv_row[r] = exact[r] ? p.kv + j_max[r] * p.kv_stride_s : p.q + t * p.q_stride_s;
    }
    auto load_rows = [&](auto aligned) {
        CUTE_UNROLL
        for (int r = 0; r < 2; ++r) load_quad_share(kc[r], kv_row[r], tig, aligned);
    };
    if (p.rows_16b_aligned) load_rows(std::true_type{});
    else load_rows(std::false_type{});
    auto q_chunk = [&](int r, int m) { return *reinterpret_cast<const uint4*>(q_tile + sw64_chunk(row0 + 8 * r, tig + 4 * m)); };
    constexpr bool kQRead = !std::is_same_v<QRead, std::nullptr_t>;
    uint4 qc[2][kChunksPerThread];
    if constexpr (kQRead) {
        CUTE_UNROLL
        for (int r = 0; r < 2; ++r)
            CUTE_UNROLL
            for (int m = 0; m < kChunksPerThread; ++m) qc[r][m] = q_chunk(r, m);
        q_read();
    }
    CUTE_UNROLL
    for (int r = 0; r < 2; ++r) {
        float dot = 0.f;
        if (exact[r]) {
            CUTE_UNROLL
            for (int m = 0; m < kChunksPerThread; ++m) dot = dot_e4m3x16(kQRead ? qc[r][m] : q_chunk(r, m), kc[r][m], dot);
        }
        const float exact_max = exact_logit(p, scale, dot);
        const int64_t h = head0 + row0 + 8 * r;
        if (h < p.h_q && tig == 0)
            write_max_lse(p, t, h, rows.max[r], rows.ref[r] + p_shift, sum[r], exact_max, rows.max[r] == -CUDART_INF_F);
    }
}

}  // namespace sparse_mla::sm90
