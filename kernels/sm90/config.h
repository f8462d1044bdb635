// Tile shape of the SM90 prefill kernel, shared by the kernel and the host that sizes its launch.
#pragma once
#include <stdint.h>

namespace sparse_mla::sm90 {

constexpr int kHeadsPerCta = 64;   // one CTA: one query token x 64 heads (rows past h_q are masked)
constexpr int kSlotsPerTile = 64;  // topk slots gathered per main-loop step
constexpr int kDv = 512;
constexpr int kWarpgroupThreads = 128;
constexpr int kConsumerWarpgroups = 2;  // each: half of d_qk for S = QK^T, half of the slots for the softmax, half of d_v for O += PV
constexpr int kConsumerThreads = kConsumerWarpgroups * kWarpgroupThreads;
constexpr int kProducerThreads = kWarpgroupThreads;   // one warpgroup: gathers kv tiles and converts them to fp16
constexpr int kThreads = kConsumerThreads + kProducerThreads;
constexpr int kProducerRegisters = 40;   // setmaxnreg: the producer gives registers to the math
constexpr int kConsumerRegisters = 232;  // 128 x 40 + 256 x 232 = 168 x 384, the registers the CTA launches with
constexpr int kKvBuffers = 2;      // fp16 kv tiles: the producer converts tile i + 1 while tile i is computed
constexpr int kKStep = 16;         // K of one fp16 wgmma
constexpr int kQkBatch = 2;        // K steps per wgmma batch of QK^T: their A registers are live together

// Shared memory, each wgmma operand 1024-byte aligned for the 128-byte swizzle:
//   kKvBuffers fp16 kv tiles [slot][kv16_cols], read as K (K-major) by QK^T and as V (MN-major) by P.V;
//     columns [kDv, kDv + kSlotsPerTile) then carry warpgroup 1's partial sums of S and the tile's P
//     (fp16, [head][slot]) once QK^T no longer reads them (for d_qk 512 they are extra columns);
//   the fp8 landing tile the gather writes into; Q in e4m3, in the order of the wgmma A fragments;
//   the kv row of each slot and its validity per buffer; warpgroup 0's partial sums of S (fp32,
//   its peer's 32 slots); per-row values (max, sum) handed between the consumer warpgroups.
constexpr int kv16_cols(int d_qk) { return d_qk > kDv + kSlotsPerTile ? d_qk : kDv + kSlotsPerTile; }
constexpr int kv16_tile_bytes(int d_qk) { return kSlotsPerTile * kv16_cols(d_qk) * 2; }
constexpr int kv16_smem_offset(int) { return 0; }
constexpr int landing_smem_offset(int d_qk) { return kKvBuffers * kv16_tile_bytes(d_qk); }
constexpr int qfrag_smem_offset(int d_qk) { return landing_smem_offset(d_qk) + kSlotsPerTile * d_qk; }
constexpr int rows_smem_offset(int d_qk) { return qfrag_smem_offset(d_qk) + kHeadsPerCta * d_qk; }
constexpr int valid_smem_offset(int d_qk) { return rows_smem_offset(d_qk) + kKvBuffers * kSlotsPerTile * 4; }
constexpr int xchg_smem_offset(int d_qk) { return valid_smem_offset(d_qk) + kKvBuffers * kSlotsPerTile * 4; }
constexpr int share_smem_offset(int d_qk) { return xchg_smem_offset(d_qk) + kHeadsPerCta * kSlotsPerTile / 2 * 4; }
constexpr int smem_bytes(int d_qk) { return share_smem_offset(d_qk) + kConsumerWarpgroups * kHeadsPerCta * 4; }

constexpr int64_t head_blocks(int64_t h_q) { return (h_q + kHeadsPerCta - 1) / kHeadsPerCta; }

}  // namespace sparse_mla::sm90
