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
constexpr int kProducerThreads = 128;  // one warpgroup: gathers kv tiles and writes V^T
constexpr int kThreads = kConsumerThreads + kProducerThreads;
constexpr int kProducerRegisters = 40;   // setmaxnreg: the producer gives registers to the math
constexpr int kConsumerRegisters = 232;  // 128 x 40 + 256 x 232 <= 65536
constexpr int kKvStages = 2;       // kv tiles in flight: the next tile's gather overlaps this tile's math
constexpr int kSlotTables = 3;     // kv row per slot: a table is read by the softmax after its kv stage is refilled
constexpr int kRowPad = 16;        // bytes added to each fp8 row: conflict-free ldmatrix
constexpr int kHalfPad = 8;        // halves added to each fp16 row (V^T, P): conflict-free ldmatrix

constexpr int fp8_row_bytes(int d_qk) { return d_qk + kRowPad; }
constexpr int half_row() { return kSlotsPerTile + kHalfPad; }

// Shared memory: Q tile, kKvStages kv tiles (fp8), V^T (fp16), P per head group (fp16), the slot
// tables, and the row max / row sum each warp hands to the other warp of its pair.
constexpr int q_smem_offset(int) { return 0; }
constexpr int kv_smem_offset(int d_qk) { return kHeadsPerCta * fp8_row_bytes(d_qk); }
constexpr int vt_smem_offset(int d_qk) { return kv_smem_offset(d_qk) + kKvStages * kSlotsPerTile * fp8_row_bytes(d_qk); }
constexpr int p_smem_offset(int d_qk) { return vt_smem_offset(d_qk) + kDv * half_row() * 2; }
constexpr int slots_smem_offset(int d_qk) { return p_smem_offset(d_qk) + kHeadsPerCta * half_row() * 2; }
constexpr int pair_smem_offset(int d_qk) { return slots_smem_offset(d_qk) + kSlotTables * kSlotsPerTile * 4; }
constexpr int smem_bytes(int d_qk) { return pair_smem_offset(d_qk) + kConsumerWarps * 16 * 4; }

constexpr int64_t head_blocks(int64_t h_q) { return (h_q + kHeadsPerCta - 1) / kHeadsPerCta; }

}  // namespace sparse_mla::sm90
