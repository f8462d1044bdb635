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

// The ring's mbarriers: a tile's full (the producer warps' lanes arrive when their copies land) and empty
// (every consumer thread arrives when it has read the tile), and the same pair for the Q tile.
template <int kBuffers>
struct RingBarriers {
    uint64_t* bars;
    __device__ uint64_t* full(int b) const { return bars + b; }
    __device__ uint64_t* empty(int b) const { return bars + kBuffers + b; }
    __device__ uint64_t* q_full() const { return bars + 2 * kBuffers; }
    __device__ uint64_t* q_empty() const { return bars + 2 * kBuffers + 1; }
    __device__ void init(int consumer_threads) const {
        for (int b = 0; b < kBuffers; ++b) mbar_init(full(b), 32 * kProducerWarps), mbar_init(empty(b), consumer_threads);
        mbar_init(q_full(), 32 * kProducerWarps), mbar_init(q_empty(), consumer_threads);
    }
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
                        const RingBarriers<kBuffers>& bars, int producer_tid) {
    constexpr int kChunks = D / 16;
    constexpr int kRowsPerLane = kSlotsPerTile / 8 / kProducerWarps;
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
            int32_t j[kRowsPerLane];
#pragma unroll
            for (int k = 0; k < kRowsPerLane; ++k) {
                const int64_t slot = int64_t{tile} * kSlotsPerTile + row0 + 8 * kProducerWarps * k;
                j[k] = slot < n_slots ? __ldg(idx_row + slot) : -1;
            }
            if (at.tile >= kBuffers) mbar_wait(bars.empty(b), (at.tile / kBuffers - 1) & 1);
#pragma unroll
            for (int k = 0; k < kRowsPerLane; ++k) {
                // an invalid row is zero-filled: nothing is read at src then
                const bool valid = work.in_range(j[k]);
                const uint8_t* src = p.kv + (valid ? j[k] * p.kv_stride_s : 0) + 16 * part;
                const uint32_t dst = landing0 + b * (kSlotsPerTile * D) + 8 * kProducerWarps * k * 64;
                if (aligned) cp_async_row_share<D / 64, kE4m3AtomColumnBytes>(dst, src, valid);
                else copy_row_share<D / 64, kE4m3AtomColumnBytes>(landing + (dst - smem_u32(landing)), src, valid);
            }
            arrive(bars.full(b));
        }
    }
    cute::cp_async_wait<0>();
}

}  // namespace sparse_mla::sm90::narrow
