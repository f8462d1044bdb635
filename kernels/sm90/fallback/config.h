// Tile shape and traits of the SM90 fallback kernel (one CTA per query token x 64 heads, O in fp32),
// shared by the kernel and the registry (kernels/registry.h).
#pragma once
#include <stdint.h>

#include "precision.h"
#include "sm90/config.h"

namespace sparse_mla::sm90::fallback {

constexpr int kHeadsPerCta = kHeadsPerWg;  // both consumer warpgroups on the same 64 heads
constexpr int kLandingBuffers = 3;         // e4m3 kv tiles: the gather runs two tiles ahead of QK^T
constexpr int kV16Cols = kDv + kSlotsPerTile;  // fp16 tile: V, then the tile's P

// Shared memory, each wgmma operand 1024-byte aligned for its swizzle:
//   the fp16 tile [slot][kV16Cols]: V (MN-major B of P.V) in the first kDv columns, P ([head][slot],
//     K-major A of P.V) in the last 64;
//   kLandingBuffers e4m3 kv tiles [slot][d_qk], K-major B of QK^T in 64-byte swizzle atoms;
//   Q [head][d_qk] in e4m3, the A of QK^T in the same atoms;
//   the validity of each landing tile's slots, a bit each; per-row values (max, sum) handed between the
//   consumer warpgroups.
constexpr int landing_smem_offset(int) { return kSlotsPerTile * kV16Cols * 2; }
constexpr int q_smem_offset(int d_qk) { return landing_smem_offset(d_qk) + kLandingBuffers * e4m3_tile_bytes(d_qk); }
constexpr int valid_smem_offset(int d_qk) { return q_smem_offset(d_qk) + kHeadsPerCta * d_qk; }
constexpr int share_smem_offset(int d_qk) { return valid_smem_offset(d_qk) + kLandingBuffers * kSlotsPerTile / 8; }

// Its entry in the registry: two consumer warpgroups (each S of half of the slots, the softmax there,
// O += PV on half of d_v) and the producer; 128 x 48 + 256 x 224 <= 168 x 384, the registers the CTA
// launches with.
struct Traits : WarpgroupRoles<2, 1, 48, 224> {
    static constexpr int kHeadsPerCta = fallback::kHeadsPerCta;
    static constexpr int smem_bytes(int d_qk) { return share_smem_offset(d_qk) + kConsumerWarpgroups * kHeadsPerCta * 4; }
    // Every call: the registry's last entry, for the calls that no kernel before it takes (its O in
    // fp32 holds the contract's bounds at any topk). An exact kernel, so both precisions.
    static constexpr bool takes(int64_t, int64_t, Precision) { return true; }
};

}  // namespace sparse_mla::sm90::fallback
