// Tile shape and traits of the SM90 wide prefill kernel (one CTA per query token x 128 heads), shared
// by the kernel and the registry (kernels/registry.h).
#pragma once
#include <stdint.h>

#include "precision.h"
#include "sm90/config.h"

namespace sparse_mla::sm90::wide {

constexpr int kConsumerWarpgroups = 2;  // each: 64 heads, all of d_v
constexpr int kHeadsPerCta = kConsumerWarpgroups * kHeadsPerWg;
constexpr int kLandingBuffers = 2;  // e4m3 kv tiles: the gather runs one tile ahead of QK^T
// O lives in f16 registers, rounded at every k16 step of P.V: when all slots name one kv row (its
// worst case) out's error is 3.8e-3 over 2048 slots and 2.9e-2 over 16384 (PERF.md), past the
// contract's 2e-2.
constexpr int64_t kMaxTopk = 2048;

// Shared memory, each wgmma operand 1024-byte aligned for its swizzle:
//   the fp16 tile [slot][kDv]: V, the MN-major B of P.V (P comes from registers);
//   kLandingBuffers e4m3 kv tiles [slot][d_qk], K-major B of QK^T in 64-byte swizzle atoms;
//   Q [head][d_qk] in e4m3, the A of QK^T in the same atoms, one half per consumer warpgroup;
//   the validity of each landing tile's slots, a bit each.
constexpr int landing_smem_offset(int) { return kSlotsPerTile * kDv * 2; }
constexpr int q_smem_offset(int d_qk) { return landing_smem_offset(d_qk) + kLandingBuffers * e4m3_tile_bytes(d_qk); }
constexpr int valid_smem_offset(int d_qk) { return q_smem_offset(d_qk) + kHeadsPerCta * d_qk; }

// Its entry in the registry: its roles and registers.
struct Traits : WarpgroupRoles<kConsumerWarpgroups, 1, 48, 224> {
    static constexpr int kHeadsPerCta = wide::kHeadsPerCta;
    static constexpr int smem_bytes(int d_qk) { return valid_smem_offset(d_qk) + kLandingBuffers * kSlotsPerTile / 8; }
    // a call that a 64-head kernel would run in two CTAs per token, at a topk where its f16 O is
    // accurate enough (an exact kernel: it takes both precisions, after wide_fast has taken fast's)
    static constexpr bool takes(int64_t h_q, int64_t topk, Precision) { return h_q > kHeadsPerWg && topk <= kMaxTopk; }
};

}  // namespace sparse_mla::sm90::wide
