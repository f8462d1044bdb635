// The exact max_logits of an item's row and the lse that takes it, as every SM90 kernel ends an item:
// the running max names its slot (the slot rides in the logit's low mantissa bits), that slot's logit
// is recomputed exactly (fp32 sums of the e4m3 products), and its exact term replaces its
// tensor-core one in the row's sum, which leaves lse only the other slots' (smaller, averaging)
// errors.
#pragma once

#include <math_constants.h>
#include <stdint.h>

#include "params.h"
#include "sm90/device_helpers.cuh"
#include "sm90/work.cuh"

namespace sparse_mla::sm90 {

// The index of the max's slot (max: the running max, base 2 with its slot bits; max_tile: its tile),
// -1 past the item's n_slots slots.
__device__ inline int32_t max_index(float max, int max_tile, int64_t n_slots, const int32_t* idx_row) {
    const int64_t slot = static_cast<int64_t>(max_tile) * kSlotsPerTile + (__float_as_uint(max) & kSlotBits);
    return slot < n_slots ? idx_row[slot] : -1;
}

// A quad's partial e4m3 dot products (each lane's share of d_qk) as the exact logit.
__device__ inline float exact_logit(const SparseMlaParams& p, const Scales& scale, float dot) {
    return quad_sum(dot) * p.sm_scale * scale.q * scale.kv;
}

// The exact logit of q row (t, h) and kv row j (0 when j names no row), both read from global
// memory by the quad, each lane a quarter of d_qk.
template <int D>
__device__ inline float exact_logit_from_global(const SparseMlaParams& p, const WorkItems& work, const Scales& scale,
                                                int64_t t, int64_t h, int32_t j, int tig) {
    float dot = 0.f;
    if (work.in_range(j)) {
        const uint8_t* kv = p.kv + j * p.kv_stride_s;
        const uint8_t* q = p.q + t * p.q_stride_s + h * p.q_stride_h;
        constexpr int kChunksPerThread = D / 16 / 4;
        uint4 k[kChunksPerThread], qc[kChunksPerThread];
        load_quad_share(k, kv, tig, p.rows_16b_aligned);
        load_quad_share(qc, q, tig, p.rows_16b_aligned);
#pragma unroll
        for (int m = 0; m < kChunksPerThread; ++m) dot = dot_e4m3x16(qc[m], k[m], dot);
    }
    return exact_logit(p, scale, dot);
}

// max_logits and lse of row h of token t: `sum` over the row's slots relative to 2^ref (base 2),
// `max` the running max (base 2) whose term `exact_max` (natural) replaces; empty: no valid slot.
__device__ inline void write_max_lse(const SparseMlaParams& p, int64_t t, int64_t h, float max, float ref, float sum,
                                     float exact_max, bool empty) {
    const float exact_sum = sum - exp2f(max - ref) + exp2f(exact_max * kLog2e - ref);
    p.max_logits[t * p.max_logits_stride_s + h * p.max_logits_stride_h] = empty ? -CUDART_INF_F : exact_max;
    p.lse[t * p.lse_stride_s + h * p.lse_stride_h] = empty ? CUDART_INF_F : (ref + log2f(exact_sum)) * kLn2;
}

}  // namespace sparse_mla::sm90
