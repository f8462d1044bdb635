// Tile shape of the SM90 64-head prefill kernel, shared by the kernel and the host that sizes its
// launch; the tile of slots, the warpgroups and their registers are the wide kernel's too (wide/config.h).
#pragma once
#include <stdint.h>

namespace sparse_mla::sm90 {

constexpr int kHeadsPerCta = 64;   // one CTA: one query token x 64 heads (rows past h_q are masked)
constexpr int kSlotsPerTile = 64;  // topk slots gathered per main-loop step
constexpr int kDv = 512;
constexpr int kWarpgroupThreads = 128;
constexpr int kConsumerWarpgroups = 2;  // each: S of half of the slots, the softmax there, O += PV on half of d_v
constexpr int kConsumerThreads = kConsumerWarpgroups * kWarpgroupThreads;
constexpr int kProducerThreads = kWarpgroupThreads;   // one warpgroup: gathers kv tiles, converts V to fp16
constexpr int kThreads = kConsumerThreads + kProducerThreads;
constexpr int kProducerRegisters = 48;   // setmaxnreg: the producer gives registers to the math
constexpr int kConsumerRegisters = 224;  // 128 x 48 + 256 x 224 <= 168 x 384, the registers the CTA launches with
constexpr int kLandingBuffers = 3;  // e4m3 kv tiles: the gather runs two tiles ahead of QK^T
constexpr int kKStep = 32;          // K of one FP8 wgmma
constexpr int kQkSets = 3;          // register sets of QK^T's per-K-step sums: two wgmmas run while one is added
constexpr int kV16Cols = kDv + kSlotsPerTile;  // fp16 tile: V, then the tile's P

// Shared memory, each wgmma operand 1024-byte aligned for its swizzle:
//   the fp16 tile [slot][kV16Cols]: V (MN-major B of P.V) in the first kDv columns, P ([head][slot],
//     K-major A of P.V) in the last 64;
//   kLandingBuffers e4m3 kv tiles [slot][d_qk], K-major B of QK^T in 64-byte swizzle atoms;
//   Q [head][d_qk] in e4m3, the A of QK^T in the same atoms;
//   the validity of each landing tile's slots, a bit each; per-row values (max, sum) handed between the
//   consumer warpgroups.
constexpr int e4m3_tile_bytes(int d_qk) { return kSlotsPerTile * d_qk; }
constexpr int v16_smem_offset(int) { return 0; }
constexpr int landing_smem_offset(int) { return kSlotsPerTile * kV16Cols * 2; }
constexpr int q_smem_offset(int d_qk) { return landing_smem_offset(d_qk) + kLandingBuffers * e4m3_tile_bytes(d_qk); }
constexpr int valid_smem_offset(int d_qk) { return q_smem_offset(d_qk) + kHeadsPerCta * d_qk; }
constexpr int share_smem_offset(int d_qk) { return valid_smem_offset(d_qk) + kLandingBuffers * kSlotsPerTile / 8; }
constexpr int smem_bytes(int d_qk) { return share_smem_offset(d_qk) + kConsumerWarpgroups * kHeadsPerCta * 4; }

constexpr int64_t head_blocks(int64_t h_q) { return (h_q + kHeadsPerCta - 1) / kHeadsPerCta; }

}  // namespace sparse_mla::sm90
