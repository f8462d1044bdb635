// Tile shape and traits of the SM90 split prefill kernel (one CTA per query token x 64 heads, each
// consumer warpgroup on one half of every tile's slots), shared by the kernel and the registry
// (kernels/registry.h).
#pragma once
#include <stdint.h>

#include "precision.h"
#include "sm90/config.h"
#include "sm90/wide/config.h"

namespace sparse_mla::sm90::split {

constexpr int kHeadsPerCta = kHeadsPerWg;  // both consumer warpgroups on the same 64 heads
constexpr int kLandingBuffers = 3;  // e4m3 kv tiles: the gather runs two tiles ahead
// Each warpgroup's f16 O sums half of a token's slots: the wide kernel's bound per warpgroup.
constexpr int64_t kMaxTopk = 2 * wide::kMaxTopk;
// Up to the dual kernel's bound the dual kernel is faster (PERF.md).
constexpr int64_t kMinTopk = wide::kMaxTopk + 1;

// The statistics of a row over one warpgroup's slots, handed to the other at an item's end.
struct RowStats {
    float max, ref, sum;
    int tile;  // the tile of max
};

// Shared memory, each wgmma operand 1024-byte aligned for its swizzle:
//   the fp16 tile [slot][kDv]: V, the MN-major B of P.V, half tile h converted and read by consumer
//     warpgroup h; at an item's end, the halves of O that the warpgroups hand each other;
//   kLandingBuffers e4m3 kv tiles [slot][d_qk], K-major B of QK^T in 64-byte swizzle atoms;
//   Q [head][d_qk] in e4m3, the A of QK^T in the same atoms, read by both consumer warpgroups;
//   the row statistics of each warpgroup. (Its consumers take slot validity from the indices.)
constexpr int landing_smem_offset(int) { return kSlotsPerTile * kDv * 2; }
constexpr int q_smem_offset(int d_qk) { return landing_smem_offset(d_qk) + kLandingBuffers * e4m3_tile_bytes(d_qk); }
constexpr int stats_smem_offset(int d_qk) { return q_smem_offset(d_qk) + kHeadsPerCta * d_qk; }
static_assert(sizeof(RowStats) == 16, "a row's statistics");

// Its entry in the registry: the fallback kernel's roles and registers.
struct Traits : WarpgroupRoles<2, 1, 48, 224> {
    static constexpr int kHeadsPerCta = split::kHeadsPerCta;
    static constexpr int smem_bytes(int d_qk) { return stats_smem_offset(d_qk) + kConsumerWarpgroups * kHeadsPerCta * 16; }
    // the calls with one block of 64 heads and from kMinTopk to kMaxTopk slots (an exact kernel: it
    // takes both precisions)
    static constexpr bool takes(int64_t h_q, int64_t topk, Precision) {
        return h_q <= kHeadsPerCta && topk >= kMinTopk && topk <= kMaxTopk;
    }
};

}  // namespace sparse_mla::sm90::split
