// The narrow kernel's ring: mbarriers, and the producer warps that gather the CTA's kv tiles (cp.async,
// each completing on its tile's mbarrier) and the Q rows of its items, in the order the consumers
// take them.
#pragma once

#include <stdint.h>

#include "params.h"
#include "sm90/device_helpers.cuh"
#include "sm90/narrow/config.h"
#include "sm90/work.cuh"

namespace sparse_mla::sm90::narrow {

// The ring's mbarriers: a tile's full (the producer warps' lanes arrive when their copies land, and each
// warp's lane 0 once more, after its validity words) and empty (every consumer thread arrives when it
// has read the tile), and the same pair for the Q tile.
template <int kBuffers>
struct RingBarriers {
    uint64_t* bars;
    __device__ uint64_t* full(int b) const { return bars + b; }
    __device__ uint64_t* empty(int b) const { return bars + kBuffers + b; }
    __device__ uint64_t* q_full() const { return bars + 2 * kBuffers; }
    __device__ uint64_t* q_empty() const { return bars + 2 * kBuffers + 1; }
    __device__ void init(int consumer_threads) const {
        for (int b = 0; b < kBuffers; ++b) mbar_init(full(b), (32 + 1) * kProducerWarps), mbar_init(empty(b), consumer_threads);
        mbar_init(q_full(), 32 * kProducerWarps), mbar_init(q_empty(), consumer_threads);
    }
};

// Which rows of each ring tile are valid (an index in range, within the token's slots), posted by the
// producer warps that gather them so that no consumer loads an index: per tile and row set k, each
// producer warp's ballot (bit l: the row of its lane l, lane / 4 + 8 (kProducerWarps k + warp)).
// Consumer warp q of a group reads set q: the tile's rows 16 q .. 16 q + 15.
struct RingValidity {
    static_assert(kProducerWarps == 2, "a row set's words as one uint2");
    uint32_t* words;  // [buffer][k][producer warp]
    __device__ void post(int b, int k, int pw, uint32_t ballot) const { words[(b * kRowSets + k) * kProducerWarps + pw] = ballot; }
    // the tile's rows 16 k + r in bit 4 r of .x, rows 16 k + 8 + r in bit 4 r of .y
    __device__ uint2 rows(int b, int k) const { return reinterpret_cast<const uint2*>(words)[b * kRowSets + k]; }
};

// Where a consumer's or the producer's unit of work is in the CTA's sequence: the n-th tile of the ring
// and the n-th Q, counted across the CTA's items (CTA c takes items c, c + gridDim.x, ...; an item is
// a token and a block of Shape::kHeads heads, one block per token where the registry chooses the
// kernel; items without slots take neither).
struct RingCursor {
    int tile = 0, q = 0;
};

// A producer warp (pw of kProducerWarps, thread `producer_tid` of 32 kProducerWarps), each gathering
// its share of every tile and of Q: a lane owns rows lane / 4 + 8 (kProducerWarps k + pw) of a tile
// and in each the chunks part + 4 m.
template <int D, int kHeads, int kBuffers>
__device__ void produce(const SparseMlaParams& p, const WorkItems& work, uint8_t* landing, uint8_t* q8,
                        const RingBarriers<kBuffers>& bars, const RingValidity& validity, int producer_tid) {
    constexpr int kChunks = D / 16;
    const int lane = producer_tid % 32, pw = producer_tid / 32, row0 = lane / 4 + 8 * pw, part = lane % 4;
    const bool aligned = p.rows_16b_aligned;
    // this lane's chunk of row row0 (+ 8 kProducerWarps k: the same swizzle) in atom column 0 of
    // landing tile 0; a landing tile is the 64-byte-swizzled layout of the other kernels'
    // (sw64_chunk), in which the 8 rows of one ldmatrix matrix, and of one warp's stores, fall in
    // distinct banks
    const uint32_t landing0 = smem_u32(landing) + sw64_chunk(row0, part);
    auto arrive = [&](uint64_t* bar) {
        if (aligned) mbar_arrive_on_copies(bar);
        else mbar_arrive(bar);  // the byte copies were plain stores
    };
    RingCursor at;
    for (int64_t item = blockIdx.x; item < work.n_items; item += gridDim.x) {
        const int64_t t = work.at(item).token, head0 = work.at(item).head0;
        const int64_t n_slots = work.slots_of(t);
        if (n_slots == 0) continue;
        const int32_t* idx_row = work.indices_of(t);
        {  // the item's Q rows, heads past h_q zero
            if (at.q >= 1) mbar_wait(bars.q_empty(), (at.q - 1) & 1);
            for (int u = producer_tid; u < kHeads * kChunks; u += 32 * kProducerWarps) {
                const int h = u / kChunks, c = u % kChunks;
                const bool valid = head0 + h < p.h_q;
                const uint8_t* src = valid ? p.q + t * p.q_stride_s + (head0 + h) * p.q_stride_h + 16 * c : p.q;
                copy_chunk(q8 + h * D + 16 * c, src, valid, aligned);
            }
            arrive(bars.q_full());
            ++at.q;
        }
        const int n_tiles = WorkItems::tiles_of(n_slots);
        for (int tile = 0; tile < n_tiles; ++tile, ++at.tile) {
            const int b = at.tile % kBuffers;
            int32_t j[kRowSets];
#pragma unroll
            for (int k = 0; k < kRowSets; ++k) {
                const int64_t slot = int64_t{tile} * kSlotsPerTile + row0 + 8 * kProducerWarps * k;
                j[k] = slot < n_slots ? __ldg(idx_row + slot) : -1;
            }
            if (at.tile >= kBuffers) mbar_wait(bars.empty(b), (at.tile / kBuffers - 1) & 1);
#pragma unroll
            for (int k = 0; k < kRowSets; ++k) {
                // an invalid row is zero-filled: nothing is read at src then
                const bool valid = work.in_range(j[k]);
                const uint32_t ballot = __ballot_sync(0xffffffffu, valid);
                if (lane == 0) validity.post(b, k, pw, ballot);
                const uint8_t* src = p.kv + (valid ? j[k] * p.kv_stride_s : 0) + 16 * part;
                const uint32_t dst = landing0 + b * (kSlotsPerTile * D) + 8 * kProducerWarps * k * 64;
                if (aligned) cp_async_row_share<D / 64, kE4m3AtomColumnBytes>(dst, src, valid);
                else copy_row_share<D / 64, kE4m3AtomColumnBytes>(landing + (dst - smem_u32(landing)), src, valid);
            }
            // cp.async's arrival orders only the copies: the words' release is a plain arrival
            if (lane == 0) mbar_arrive(bars.full(b));
            arrive(bars.full(b));
        }
    }
    cute::cp_async_wait<0>();
}

}  // namespace sparse_mla::sm90::narrow
