// The work the SM90 prefill kernels share: their items (a token and a block of heads) on a persistent
// grid, the slots of a token, Q's and V's copies, a producer's cursor over its units across items, and
// the producer warpgroup of the fallback, wide and split kernels, which gathers the kv tiles and
// converts their V to fp16 (the dual kernel's works on half tiles, in its own order: dual/).
#pragma once

#include <stdint.h>

#include <type_traits>

#include <cute/arch/copy_sm80.hpp>

#include "params.h"
#include "sm90/config.h"
#include "sm90/device_helpers.cuh"

namespace sparse_mla::sm90 {

// Work items: (token, heads_per_cta heads), item k = token k / n_head_blocks. The grid is
// persistent: CTA c takes items c, c + gridDim.x, ..., so that one item's epilogue and the next one's
// first gathers and Q overlap (the narrow kernels claim theirs from a counter: narrow/ring.cuh). An
// item's result does not depend on which CTA computes it.
struct WorkItems {
    struct Item {
        int64_t token, head0;
    };
    const SparseMlaParams& p;
    int64_t heads_per_cta, n_head_blocks, n_items;

    __device__ WorkItems(const SparseMlaParams& params, int64_t heads)
        : p(params), heads_per_cta(heads), n_head_blocks(head_blocks(params.h_q, heads)),
          n_items(params.s_q * n_head_blocks) {}
    __device__ Item at(int64_t item) const { return Item{item / n_head_blocks, (item % n_head_blocks) * heads_per_cta}; }
    // the slots of token t (topk_length clamped to [0, topk]) and their tiles (topk < 2^37)
    __device__ int64_t slots_of(int64_t t) const {
        if (!p.topk_length) return p.topk;
        const int64_t len = p.topk_length[t * p.topk_length_stride];
        return len < 0 ? 0 : (len < p.topk ? len : p.topk);
    }
    __device__ static int tiles_of(int64_t n_slots) { return static_cast<int>((n_slots + kSlotsPerTile - 1) / kSlotsPerTile); }
    // token t's row of indices
    __device__ const int32_t* indices_of(int64_t t) const { return p.indices + t * p.indices_stride_s; }
    __device__ bool in_range(int32_t j) const { return j >= 0 && j < p.s_kv; }
    // whether slot `slot` of a token (its indices at idx_row, n_slots of them) names a kv row
    __device__ bool valid_slot(const int32_t* idx_row, int64_t n_slots, int64_t slot) const {
        return slot < n_slots && in_range(idx_row[slot]);
    }
    // An item as a consumer warpgroup takes it: its token t and first head (head_offset: the
    // warpgroup's heads within the item), the token's slots, tiles and indices, and whether the CTA
    // takes another item after it.
    struct Taken {
        int64_t t, head0, n_slots;
        int n_tiles;
        const int32_t* idx_row;
        bool more;
    };
    // whether the CTA takes another item after `item` (the grid is persistent: items in turn)
    __device__ bool has_next(int64_t item) const { return item + gridDim.x < n_items; }
    __device__ Taken take(int64_t item, int64_t head_offset = 0) const {
        const Item it = at(item);
        const int64_t n_slots = slots_of(it.token);
        return Taken{it.token, it.head0 + head_offset, n_slots, tiles_of(n_slots), indices_of(it.token),
                     has_next(item)};
    }
};

// A consumer's wait for its item's Q (load_q_rows' copies): its own copies, then every thread's
// (`threads` threads on named barrier `bar`).
__device__ inline void await_q(int bar, int threads) {
    cute::cp_async_wait<0>();
    fence_for_tensor_cores();
    bar_sync(bar, threads);
}

// The call's scales: q_scale and kv_scale (numbers, or device pointers read here: no host sync), and
// what takes an e4m3 dot product to a base-2 logit.
struct Scales {
    float q, kv, logit;
    __device__ explicit Scales(const SparseMlaParams& p)
        : q(p.q_scale_ptr ? *p.q_scale_ptr : p.q_scale), kv(p.kv_scale_ptr ? *p.kv_scale_ptr : p.kv_scale),
          logit(p.sm_scale * q * kv * kLog2e) {}
};

// Q rows of an item into a tile in Q's swizzled layout (64-byte atoms, rows of d_qk bytes): its token's
// heads head0 + head_offset .. + kHeads - 1, copied by kThreads threads (this one `first`); heads past
// h_q become zero rows. One cp.async group. As the producers gather kv rows: four threads a row, each
// its chunks part + 4 m, one swizzle atom column apart in the tile and 64 bytes apart in the row, so
// that a row's copies take one address computation (a loop over every chunk with its own division,
// 64-bit address and alignment test was 18% of dual_fast's consumer samples at width 128: PERF.md).
template <int D, int kHeads, int kThreads, bool kOpaqueTile = false>
__device__ void load_q_rows(const SparseMlaParams& p, const WorkItems& work, int64_t item, uint8_t* tile, int first,
                            int head_offset = 0) {
    constexpr int kRowsPerPass = kThreads / 4;
    static_assert(kThreads % 4 == 0 && kHeads % kRowsPerPass == 0, "whole rows per pass");
    static_assert(kHeads == kSlotsPerTile, "a Q tile of a landing tile's rows (sw64_chunk's atom columns)");
    // item and first (and, kOpaqueTile, tile) made opaque to the compiler: the addresses computed from
    // them are computed here, each time, not hoisted out of the caller's item loop and held in
    // registers across it, which spilled the kernels' out stores (which of the three: PERF.md)
    if constexpr (kOpaqueTile) asm volatile("" : "+l"(item), "+r"(first), "+l"(tile));
    else asm volatile("" : "+l"(item), "+r"(first));
    const WorkItems::Item at = work.at(item);
    const int part = first % 4;
    const uint8_t* q_token = p.q + at.token * p.q_stride_s + 16 * part;
    auto copy_rows = [&](auto aligned) {
#pragma unroll 1
        for (int pass = 0; pass < kHeads / kRowsPerPass; ++pass) {
            const int r = first / 4 + pass * kRowsPerPass;
            const int64_t h = at.head0 + head_offset + r;
            const bool valid = h < p.h_q;
            const uint8_t* src = valid ? q_token + h * p.q_stride_h : p.q;
            uint8_t* dst = tile + sw64_chunk(r, part);
            if constexpr (aligned) cp_async_row_share<D / 64, kE4m3AtomColumnBytes>(smem_u32(dst), src, valid);
            else copy_row_share<D / 64, kE4m3AtomColumnBytes>(dst, src, valid);
        }
    };
    if (p.rows_16b_aligned) copy_rows(std::true_type{});
    else copy_rows(std::false_type{});
    cute::cp_async_fence();
}

// A consumer thread of a kernel with traits K (sm90/config.h's WarpgroupRoles) once it has taken the
// registers the producer warpgroup gave up: its warpgroup (through a shuffle where there are two, as
// in CUTLASS, so that ptxas treats it as warp-uniform), its place in it, its lane and place in its
// quad, and the rows of its warpgroup's 64 heads it holds in a wgmma accumulator: row0 and row0 + 8.
struct ConsumerThread {
    int wg, wg_tid, lane, tig, row0;
};
template <class K>
__device__ inline ConsumerThread enter_consumer() {
    asm volatile("setmaxnreg.inc.sync.aligned.u32 %0;" ::"n"(K::kConsumerRegisters));
    const int tid = threadIdx.x, lane = tid % 32;
    if constexpr (K::kConsumerWarpgroups == 1) return {0, tid, lane, lane % 4, 16 * (tid / 32) + lane / 4};
    const int wg_tid = tid % kWarpgroupThreads;
    return {__shfl_sync(0xffffffffu, tid / kWarpgroupThreads, 0), wg_tid, lane, lane % 4, 16 * (wg_tid / 32) + lane / 4};
}

// V of one row of a landing tile in fp16: its 16-byte e4m3 chunks m (m < kDv / 64: those of one of
// the row's four threads), an atom column (kLandingColumnBytes) apart, each into two 16-byte pieces at
// lo and hi, an fp16 atom column (kV16ColumnBytes) apart. A group's loads first, so that their
// latencies overlap (all of them would spill).
template <int kLandingColumnBytes, int kV16ColumnBytes>
__device__ inline void convert_row_v(const uint8_t* src, uint8_t* lo, uint8_t* hi) {
    constexpr int kGroup = 2, kChunksOfV = kDv / 64;
#pragma unroll
    for (int m0 = 0; m0 < kChunksOfV; m0 += kGroup) {
        uint4 e4m3[kGroup];
#pragma unroll
        for (int m = 0; m < kGroup; ++m) e4m3[m] = *reinterpret_cast<const uint4*>(src + (m0 + m) * kLandingColumnBytes);
#pragma unroll
        for (int m = 0; m < kGroup; ++m) {
            const uint32_t w[4] = {e4m3[m].x, e4m3[m].y, e4m3[m].z, e4m3[m].w};
            uint32_t h[8];
#pragma unroll
            for (int i = 0; i < 8; i += 2) {
                const uint2 two = e4m3x4_to_half2x2(w[i / 2]);
                h[i] = two.x;
                h[i + 1] = two.y;
            }
            *reinterpret_cast<uint4*>(lo + (m0 + m) * kV16ColumnBytes) = make_uint4(h[0], h[1], h[2], h[3]);
            *reinterpret_cast<uint4*>(hi + (m0 + m) * kV16ColumnBytes) = make_uint4(h[4], h[5], h[6], h[7]);
        }
    }
}

// Precision "fast": V of 32 rows of an e4m3 landing tile (rows row0 .. row0 + 31 of a tile of kRows
// rows) transposed into an e4m3 V^T tile of 32 slots (a VtTile), its slots in p_slot order, by the
// 128 threads of a producer warpgroup (thread t). Warp w takes V's 16-byte chunks c = w, w + 4, ...,
// each by one ldmatrix.trans, four byte permutes and one stmatrix a lane. The four loaded matrices
// are the landing rows (chunk c) of K positions 4 q + {0, 1} (matrix 0) and 4 q + {2, 3} (matrix 1),
// q < 4, and the same + 16 (matrices 2 and 3): lane l then holds columns 2 (l / 4) and + 1 of four
// consecutive K positions from 4 (l % 4) on, which the permutes make into one word per column, the
// four words of the V^T rows that stmatrix writes. Lanes 16..31 put their odd column first, so that
// the 8 rows of each stored matrix fall on 32 banks, as those of each loaded one do
// (ci/models/transpose_banks.py models it all). Every row must have landed for every thread (the
// rows are other threads' copies).
template <int kRows>
__device__ inline void transpose_v_half(const uint8_t* landing, int row0, uint8_t* vt, int t) {
    // VtTile's offsets (the swizzle applied, in elements) are bytes because its elements are
    static_assert(sizeof(cute::float_e4m3_t) == 1, "VtTile offsets in bytes");
    using Vt = VtTile<kSlotsPerTile / 2>;
    constexpr int kWarps = 4, kChunks = kDv / 16;
    // one chunk on: 64 V^T rows, and the landing tile's next atom column (c % 4 stays the warp)
    static_assert(Vt{}(64, 0) == 64 * 32 && Vt{}(64 + 4, 16) == Vt{}(4, 16) + 64 * 32, "V^T rows of 32 bytes");
    const int warp = t / 32, l = t % 32, m = l / 8, i = l % 8;
    const uint32_t src = smem_u32(landing) + sw64_chunk(row0 + p_slot(16 * (m / 2) + 4 * (i / 2) + 2 * (m % 2) + i % 2), warp, kRows);
    const uint32_t dst = smem_u32(vt) + Vt{}(16 * warp + 2 * i + ((i / 4) ^ (m % 2)), 16 * (m / 2));
    const bool odd_first = l / 16;
    const uint32_t first = odd_first ? 0x7531 : 0x6420, second = odd_first ? 0x6420 : 0x7531;
#pragma unroll
    for (int n = 0; n < kChunks / kWarps; ++n) {
        uint32_t r[4], cols[4];
        ldmatrix_x4_trans(r, src + n * kRows * 64);
        cols[0] = __byte_perm(r[0], r[1], first);
        cols[1] = __byte_perm(r[0], r[1], second);
        cols[2] = __byte_perm(r[2], r[3], first);
        cols[3] = __byte_perm(r[2], r[3], second);
        stmatrix_x4(dst + n * 64 * 32, cols);
    }
}

// A producer's place in its CTA's sequence of units across its items, in the order the consumers take
// them: a unit is a tile of kSlotsPerTile slots (kUnitsPerTile 1) or a part of one (the dual kernel's
// half tiles); an item has kUnitsPerTile units per tile of its slots.
template <int kUnitsPerTile>
struct UnitCursor {
    static constexpr int kUnitSlots = kSlotsPerTile / kUnitsPerTile;
    int64_t item;  // from blockIdx.x on: open() finds the first item with units
    int64_t n_slots = 0;
    const int32_t* idx_row = nullptr;
    int unit = 0, n_units = 0;

    __device__ bool done(const WorkItems& work) const { return item >= work.n_items; }
    // on to the next unit: past an item's last, the next item with units
    __device__ void advance(const WorkItems& work) {
        if (++unit == n_units) {
            item += gridDim.x;
            open(work);
        }
    }
    // the item's slot of the unit's row, and a slot's index (-1 past the item's slots)
    __device__ int64_t slot(int row) const { return static_cast<int64_t>(unit) * kUnitSlots + row; }
    __device__ int32_t index(int64_t s) const { return s < n_slots ? idx_row[s] : -1; }
    // from item on, the first item with units
    __device__ void open(const WorkItems& work) {
        for (; item < work.n_items; item += gridDim.x) {
            const int64_t t = work.at(item).token;
            n_slots = work.slots_of(t);
            n_units = kUnitsPerTile * work.tiles_of(n_slots);
            idx_row = work.indices_of(t);
            unit = 0;
            if (n_units > 0) return;
        }
    }
};

// The producer warpgroup of a kernel with traits K (it first gives its registers to the consumers,
// K::kProducerRegisters; K's roles: sm90/config.h's WarpgroupRoles): the CTA's tiles in order
// across its items, each gathered (cp.async) into one of kBuffers landing tiles, kBuffers - 1 tiles
// ahead of QK^T, with the validity of its slots in slot_valid (unless that is null: the consumers
// then take it from the indices); then its V converted to fp16 into the one fp16 tile, a half tile
// (32 slots) at a time.
// The consumers arrive on the named barrier landing_empty_bar0 + buffer once their QK^T has read a
// landing tile; producers_bar is the producer's own. kVt (precision "fast"): V is transposed
// into two e4m3 V^T half tiles (VtTiles of 32 slots, one after the other) instead. Tile i's V goes
// into V tile i % kV16Buffers (kV16Buffers of them, one after the other at v16). The rest is each
// kernel's: announce_landed(buffer) tells the consumers that a tile landed, wait_v16_free(i, half)
// waits until their P.V has read that half of the V tile that tile i takes (that of tile i -
// kV16Buffers), announce_converted(i, half) tells them that it holds tile i's V.
template <class K, int D, int kBuffers, bool kVt = false, int kV16Buffers = 1, class Landed, class V16Free,
          class Converted>
__device__ void produce(const SparseMlaParams& p, const WorkItems& work, uint8_t* landing0_tile, uint8_t* v16,
                        uint32_t (*slot_valid)[K::kConsumerWarpgroups], int landing_empty_bar0, int producers_bar,
                        Landed announce_landed, V16Free wait_v16_free, Converted announce_converted) {
    asm volatile("setmaxnreg.dec.sync.aligned.u32 %0;" ::"n"(K::kProducerRegisters));
    constexpr int kChunks = D / 16;  // 16-byte chunks of an e4m3 row
    constexpr int kHalfSlots = kSlotsPerTile / 2;
    auto landing = [&](int buffer) { return landing0_tile + buffer * e4m3_tile_bytes(D); };
    const int ptid = threadIdx.x - K::kConsumerThreads;
    // A half tile is 32 rows of 16-byte chunks; a thread owns one row, and in it the chunks
    // ptid % 4 + 4 m: one swizzle atom column apart in both the landing tile (64 e4m3 columns)
    // and the fp16 tile (64 fp16 columns), so that one address per row serves every m.
    constexpr int kThreadsPerRow = K::kProducerThreads / kHalfSlots;
    static_assert(kThreadsPerRow == 4, "a row's threads cover one 64-byte e4m3 atom row");
    const int row = ptid / kThreadsPerRow, part = ptid % kThreadsPerRow;
    constexpr int kV16AtomColumnBytes = kSlotsPerTile * 128;

    // This CTA's tiles in order, across its items: the cursor of the next tile to gather.
    UnitCursor<1> next{blockIdx.x};
    // the indices of this thread's two slots in the cursor's tile (-1 past n_slots; a pair, not an
    // array: an array indexed in a loop would go to memory), loaded a gather ahead and checked
    // only there, to hide the latency
    auto tile_indices = [&]() {
        const int64_t slot = next.slot(row);
        return !next.done(work) ? make_int2(next.index(slot), next.index(slot + kHalfSlots)) : make_int2(-1, -1);
    };
    // the validity of this thread's two slots in each landing buffer, posted to the consumers only
    // when the tile is announced: the flags of a buffer are then rewritten long after the
    // consumers last read them
    uint32_t valid_bits = 0;
    // this thread's chunk of its row in each half tile: the same offset in every landing tile;
    // the shared-window address of landing tile 0 (held, not rederived per copy)
    const uint32_t row_chunk[2] = {sw64_chunk(row, part), sw64_chunk(kHalfSlots + row, part)};
    const uint32_t landing0 = static_cast<uint32_t>(__cvta_generic_to_shared(landing(0)));
    auto gather = [&](int buffer, int2 indices) {
        for (int half = 0; half < 2; ++half) {
            const int32_t j = half ? indices.y : indices.x;
            const bool valid = work.in_range(j);
            valid_bits = (valid_bits & ~(1u << (2 * buffer + half))) | (static_cast<uint32_t>(valid) << (2 * buffer + half));
            // an invalid row is zero-filled: cp.async then reads nothing at src
            const uint8_t* src = p.kv + (valid ? j * p.kv_stride_s : 0) + 16 * part;
            constexpr int kChunksPerThread = kChunks / kThreadsPerRow;
            // the aligned rows on their own path: one loop through copy_chunk for both kinds does
            // not unroll and made the kernel 12% slower (PERF-HISTORY.md)
            if (p.rows_16b_aligned)
                cp_async_row_share<kChunksPerThread, kE4m3AtomColumnBytes>(landing0 + buffer * e4m3_tile_bytes(D) + row_chunk[half],
                                                                           src, valid);
            else
                copy_row_share<kChunksPerThread, kE4m3AtomColumnBytes>(landing(buffer) + row_chunk[half], src, valid);
        }
        cute::cp_async_fence();
    };
    // the row's two 16-byte pieces of fp16 columns 16 part .. + 15 in atom column 0 (plain shared
    // addresses: CuTe's swizzled pointers would become generic stores), per half tile; a half tile's
    // slots are their own bytes of every atom column, so that the consumers read one while the other is written
    const uint32_t v16_lo[2] = {sw128_byte(row, 16 * part), sw128_byte(kHalfSlots + row, 16 * part)};
    const uint32_t v16_hi[2] = {sw128_byte(row, 16 * part + 8), sw128_byte(kHalfSlots + row, 16 * part + 8)};
    auto convert_v = [&](int buffer, int half) {
        convert_row_v<kE4m3AtomColumnBytes, kV16AtomColumnBytes>(landing(buffer) + row_chunk[half], v16 + v16_lo[half],
                                                                 v16 + v16_hi[half]);
    };

    // Tile i + kBuffers - 1 is gathered while tile i is computed. One cp.async group per
    // tile (empty past the last), so that a fixed wait count finds tile i landed. Every arrival
    // of the consumers is waited for exactly once.
    next.open(work);
    int2 next_indices = tile_indices();
    int n_gathered = 0;
    auto gather_next = [&]() {
        if (next.done(work)) {
            cute::cp_async_fence();
            return;
        }
        const int2 indices = next_indices;
        next.advance(work);
        next_indices = tile_indices();
        gather(n_gathered++ % kBuffers, indices);
    };
    for (int i = 0; i < kBuffers - 1; ++i) gather_next();
    for (int tile = 0; tile < n_gathered; ++tile) {
        const int buffer = tile % kBuffers;
        cute::cp_async_wait<kBuffers - 2>();
        fence_for_tensor_cores();
        // warp w holds rows 8 w .. 8 w + 7, four lanes each: byte w of each half's word
        for (int half = 0; half < 2 && slot_valid != nullptr; ++half) {
            uint32_t bits = __ballot_sync(0xffffffffu, (valid_bits >> (2 * buffer + half)) & 1) & 0x11111111u;
            bits = (bits | bits >> 3) & 0x03030303u;  // a row's bit every 4 lanes, gathered into a byte
            bits = (bits | bits >> 6) & 0x000f000fu;
            bits = (bits | bits >> 12) & 0xffu;
            if (ptid % 32 == 0) reinterpret_cast<uint8_t*>(&slot_valid[buffer][half])[ptid / 32] = static_cast<uint8_t>(bits);
        }
        announce_landed(buffer);
        if (tile >= 1) bar_sync(landing_empty_bar0 + (tile - 1) % kBuffers, K::kThreads);  // QK^T of tile - 1 done
        gather_next();
        bar_sync(producers_bar, K::kProducerThreads);  // tile landed, from every thread
        for (int half = 0; half < 2; ++half) {
            if (tile >= kV16Buffers) wait_v16_free(tile, half);  // P.V of tile - kV16Buffers has read this half
            if constexpr (kVt) {
                uint8_t* vt = v16 + (2 * (tile % kV16Buffers) + half) * kVtTileBytes;
                transpose_v_half<kSlotsPerTile>(landing(buffer), kHalfSlots * half, vt, ptid);
            } else {
                static_assert(kV16Buffers == 1, "one fp16 tile");
                convert_v(buffer, half);
            }
            fence_for_tensor_cores();
            announce_converted(tile, half);
        }
    }
    if (n_gathered >= 1) {
        bar_sync(landing_empty_bar0 + (n_gathered - 1) % kBuffers, K::kThreads);
        // the P.V of the last tiles
        for (int tile = n_gathered > kV16Buffers ? n_gathered : kV16Buffers; tile < n_gathered + kV16Buffers; ++tile)
            for (int half = 0; half < 2; ++half) wait_v16_free(tile, half);
    }
}

}  // namespace sparse_mla::sm90
