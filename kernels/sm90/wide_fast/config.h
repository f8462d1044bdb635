// Tile shape and traits of the SM90 wide_fast prefill kernel (precision "fast": one CTA per query
// token x 128 heads, its two consumer warpgroups taking the tensor cores in turns), shared by the
// kernel and the registry (kernels/registry.h).
#pragma once
#include <stdint.h>

#include "precision.h"
#include "sm90/config.h"
#include "sm90/wide/config.h"

namespace sparse_mla::sm90::wide_fast {

// the wide kernel's CTA: two consumer warpgroups of 64 heads and all of d_v, two landing tiles
using wide::kConsumerWarpgroups;
using wide::kHeadsPerCta;
using wide::kLandingBuffers;
// e4m3 V^T tiles: the producer transposes tile i while the warpgroups' P.V reads tile i - 1
constexpr int kVtBuffers = 2;
constexpr int kVtBufferBytes = 2 * kVtTileBytes;  // a V^T buffer: a tile's two VtTiles

// Shared memory, each wgmma operand 1024-byte aligned for its swizzle:
//   kVtBuffers e4m3 V^T tiles, each two VtTiles of 32 slots: the K-major B of P.V;
//   kLandingBuffers e4m3 kv tiles [slot][d_qk], K-major B of QK^T in 64-byte swizzle atoms;
//   Q [head][d_qk] in e4m3, the A of QK^T in the same atoms, one half per consumer warpgroup;
//   the mbarriers on which the producer says that a landing tile, or a V^T tile, is full.
constexpr int landing_smem_offset(int) { return kVtBuffers * kVtBufferBytes; }
constexpr int q_smem_offset(int d_qk) { return landing_smem_offset(d_qk) + kLandingBuffers * e4m3_tile_bytes(d_qk); }
constexpr int bars_smem_offset(int d_qk) { return q_smem_offset(d_qk) + kHeadsPerCta * d_qk; }
constexpr int kFullBars = kLandingBuffers + kVtBuffers;

// Its entry in the registry, before the wide kernel: the calls that kernel takes, in precision
// "fast" (its O is the wide kernel's f16 one, with P's scale following the row sum). Consumers 232
// registers, producer 40: the whole launch pool (168 x 384); O, the two QK^T chains and P take 232
// (at 224 ptxas serializes the wgmmas, C7512: PERF.md).
struct Traits : WarpgroupRoles<kConsumerWarpgroups, 1, 40, 232> {
    static constexpr int kHeadsPerCta = wide_fast::kHeadsPerCta;
    static constexpr int smem_bytes(int d_qk) { return bars_smem_offset(d_qk) + kFullBars * 8; }
    static constexpr bool takes(int64_t h_q, int64_t topk, Precision precision) {
        return precision == Precision::fast && wide::Traits::takes(h_q, topk, precision);
    }
};
static_assert(Traits::smem_bytes(576) <= 227 * 1024, "shared memory of one SM90 CTA");

}  // namespace sparse_mla::sm90::wide_fast
