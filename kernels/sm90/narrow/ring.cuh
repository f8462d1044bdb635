// The narrow kernel's ring: mbarriers, and the producer warps that gather the CTA's kv tiles (cp.async,
// each completing on its tile's mbarrier) and the Q rows of its items, in the order the consumers
// take them. The producer warps also choose the CTA's items and post each with its Q.
#pragma once

#include <stdint.h>

#include "params.h"
#include "sm90/device_helpers.cuh"
#include "sm90/narrow/config.h"
#include "sm90/work.cuh"

namespace sparse_mla::sm90::narrow {

// The ring's mbarriers: a tile's full (the producer warps' lanes arrive when their copies land, and each
// warp's lane 0 once more, after its validity words) and empty (every consumer thread arrives when it
// has read the tile), and the same pair for the Q tile, which also posts its item (the producer warps'
// lanes arrive when their Q copies land, and lane 0 of warp 0 once more, after the item word). Then
// kRingWords words: the item of the Q tile (n_items or more: the CTA's end), and the producer warps'
// two slots for the next item that warp 0 claims.
template <int kBuffers>
struct RingBarriers {
    uint64_t* bars;
    __device__ uint64_t* full(int b) const { return bars + b; }
    __device__ uint64_t* empty(int b) const { return bars + kBuffers + b; }
    __device__ uint64_t* q_full() const { return bars + 2 * kBuffers; }
    __device__ uint64_t* q_empty() const { return bars + 2 * kBuffers + 1; }
    __device__ int64_t* q_item() const { return reinterpret_cast<int64_t*>(bars + 2 * kBuffers + 2); }
    __device__ int64_t* claimed(int k) const { return reinterpret_cast<int64_t*>(bars + 2 * kBuffers + 3 + k); }
    static_assert(kRingWords == 3, "the item word and two claim slots");
    __device__ void init(int consumer_threads) const {
        for (int b = 0; b < kBuffers; ++b) mbar_init(full(b), (32 + 1) * kProducerWarps), mbar_init(empty(b), consumer_threads);
        mbar_init(q_full(), 32 * kProducerWarps + 1), mbar_init(q_empty(), consumer_threads);
    }
    // A consumer's next item (its q-th), as the producer warps posted it with its Q: the Q tile (if the
    // item has slots) and the item word are the consumers' until each of their threads releases them.
    __device__ int64_t await_item(int q) const {
        mbar_wait(q_full(), q & 1);
        return *q_item();
    }
    __device__ void release_item(int& q) const {
        mbar_arrive(q_empty());
        ++q;
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
// and the n-th Q, counted across the CTA's items (an item is a token and a block of Shape::kHeads
// heads, one block per token where the registry chooses the kernel; every item takes a Q, whose copies
// are skipped where it has no slots, and its tiles).
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
    // The CTA's items, as counts of items taken (`taken`): blockIdx.x, then each claimed from the
    // call's counter (p.item_counter) as the last tile of the one before it is gathered, so that a CTA
    // that runs faster than its SM's other takes more items (the first CTAs on an SM take ~12% less
    // time an item: PERF.md) and the CTAs end within about one item of each other; without a counter,
    // in turn. The n-th item taken is work item n_items - 1 - n, the last tokens first: a causal
    // prompt's rows grow with the token (V4's compressed rows, any row shorter than topk), so the
    // longest items come first and the CTAs' last items are the shortest. An item's result does not
    // depend on which CTA computes it.
    RingCursor at;
    uint64_t claim = 0;  // warp 0's lane 0: the counter's value for the next item
    for (int64_t taken = blockIdx.x;;) {
        const bool end = taken >= work.n_items;
        const int64_t item = end ? taken : work.n_items - 1 - taken;
        if (at.q >= 1) mbar_wait(bars.q_empty(), (at.q - 1) & 1);
        if (producer_tid == 0) *bars.q_item() = item;
        const int64_t t = end ? 0 : work.at(item).token, head0 = end ? 0 : work.at(item).head0;
        const int64_t n_slots = end ? 0 : work.slots_of(t);
        // the item's Q rows, heads past h_q zero
        for (int u = producer_tid; n_slots > 0 && u < kHeads * kChunks; u += 32 * kProducerWarps) {
            const int h = u / kChunks, c = u % kChunks;
            const bool valid = head0 + h < p.h_q;
            const uint8_t* src = valid ? p.q + t * p.q_stride_s + (head0 + h) * p.q_stride_h + 16 * c : p.q;
            copy_chunk(q8 + h * D + 16 * c, src, valid, aligned);
        }
        // cp.async's arrival orders only the copies: the item word's release is a plain arrival
        if (producer_tid == 0) mbar_arrive(bars.q_full());
        arrive(bars.q_full());
        ++at.q;
        if (end) break;
        const int32_t* idx_row = work.indices_of(t);
        const int n_tiles = WorkItems::tiles_of(n_slots);
        auto claim_next = [&]() {
            if (producer_tid == 0 && p.item_counter != nullptr) claim = atomicAdd(p.item_counter, 1ull);
        };
        if (n_tiles == 0) claim_next();
        for (int tile = 0; tile < n_tiles; ++tile, ++at.tile) {
            const int b = at.tile % kBuffers;
            if (tile == n_tiles - 1) claim_next();
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
        if (p.item_counter == nullptr) {
            taken += gridDim.x;
        } else {  // warp 0's claim to both warps (two slots: the one read here is not rewritten before the next barrier)
            if (producer_tid == 0) *bars.claimed(at.q & 1) = static_cast<int64_t>(gridDim.x + claim);
            bar_sync(kProducersBar, 32 * kProducerWarps);
            taken = *bars.claimed(at.q & 1);
        }
    }
    cute::cp_async_wait<0>();
}

}  // namespace sparse_mla::sm90::narrow
