// Tile shape of the SM90 prefill kernel, shared by the kernel and the host that sizes its launch.
#pragma once
#include <stdint.h>

namespace sparse_mla::sm90 {

constexpr int kHeadsPerCta = 64;   // one CTA: one query token x 64 heads (rows past h_q are masked)
constexpr int kSlotsPerTile = 64;  // topk slots gathered per main-loop step
constexpr int kDv = 512;
constexpr int kHeadGroups = 4;     // 16 heads each
constexpr int kConsumerWarps = 8;  // each head group: 2 warps, each half of the slots for S, half of d_v for O
constexpr int kConsumerThreads = kConsumerWarps * 32;
constexpr int kProducerThreads = 128;  // one warpgroup: gathers kv rows and converts them to fp16
constexpr int kThreads = kConsumerThreads + kProducerThreads;
constexpr int kProducerRegisters = 56;   // setmaxnreg: the producer gives registers to the math
constexpr int kConsumerRegisters = 224;  // 128 x 56 + 256 x 224 <= 65536
constexpr int kKvStages = 2;       // fp16 kv tiles: the producer fills one while the consumers use the other
constexpr int kSlotTables = kKvStages;  // kv row of each slot, one table per kv stage
constexpr int kQRowPad = 16;       // bytes added to each fp8 Q row: conflict-free ldmatrix
constexpr int kKvRowPad = 16;      // halves added to each fp16 kv row: conflict-free 8-byte fragment loads
constexpr int kPRowPad = 8;        // halves added to each P row: conflict-free ldmatrix

constexpr int q_row_bytes(int d_qk) { return d_qk + kQRowPad; }
constexpr int kv_row_halves(int d_qk) { return d_qk + kKvRowPad; }
constexpr int p_row_halves() { return kSlotsPerTile + kPRowPad; }

// Shared memory: Q (fp8), kKvStages kv tiles (fp16: K for QK^T and, its first d_v columns, V for P.V),
// P per head group (fp16), the slot tables, and the row max / row sum each warp hands to the other
// warp of its pair.
constexpr int q_smem_offset(int) { return 0; }
constexpr int kv_tile_halves(int d_qk) { return kSlotsPerTile * kv_row_halves(d_qk); }
constexpr int kv_smem_offset(int d_qk) { return kHeadsPerCta * q_row_bytes(d_qk); }
constexpr int p_smem_offset(int d_qk) { return kv_smem_offset(d_qk) + kKvStages * kv_tile_halves(d_qk) * 2; }
constexpr int slots_smem_offset(int d_qk) { return p_smem_offset(d_qk) + kHeadsPerCta * p_row_halves() * 2; }
constexpr int pair_smem_offset(int d_qk) { return slots_smem_offset(d_qk) + kSlotTables * kSlotsPerTile * 4; }
constexpr int smem_bytes(int d_qk) { return pair_smem_offset(d_qk) + kConsumerWarps * 16 * 4; }

constexpr int64_t head_blocks(int64_t h_q) { return (h_q + kHeadsPerCta - 1) / kHeadsPerCta; }

}  // namespace sparse_mla::sm90
