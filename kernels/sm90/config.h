// Tile shape of the SM90 prefill kernel, shared by the kernel and the host that sizes its launch.
#pragma once
#include <stdint.h>

namespace sparse_mla::sm90 {

constexpr int kHeadsPerCta = 64;   // one CTA: one query token x 64 heads (rows past h_q are masked)
constexpr int kSlotsPerTile = 64;  // topk slots gathered per main-loop step
constexpr int kDv = 512;
constexpr int kWarpgroups = 2;     // each: half of the slots for S = QK^T, half of d_v for O += PV
constexpr int kThreads = kWarpgroups * 128;
constexpr int kKvStages = 2;       // kv tiles in flight: the next tile's gather overlaps this tile's math
constexpr int kSlotTables = 3;     // kv row per slot for tiles i (softmax), i + 1 (gather), i + 2 (filled)

// Shared memory, every tile 1024-byte aligned for the wgmma swizzles: Q and kKvStages kv tiles (fp8,
// K-major), V (fp16, MN-major), P (fp16, K-major), the slot tables, and the per-row values (max,
// sum) each warpgroup hands to the other.
constexpr int q_smem_offset(int) { return 0; }
constexpr int kv_tile_bytes(int d_qk) { return kSlotsPerTile * d_qk; }
constexpr int kv_smem_offset(int d_qk) { return kHeadsPerCta * d_qk; }
constexpr int v_smem_offset(int d_qk) { return kv_smem_offset(d_qk) + kKvStages * kv_tile_bytes(d_qk); }
constexpr int p_smem_offset(int d_qk) { return v_smem_offset(d_qk) + kDv * kSlotsPerTile * 2; }
constexpr int slots_smem_offset(int d_qk) { return p_smem_offset(d_qk) + kHeadsPerCta * kSlotsPerTile * 2; }
constexpr int rows_smem_offset(int d_qk) { return slots_smem_offset(d_qk) + kSlotTables * kSlotsPerTile * 4; }
constexpr int smem_bytes(int d_qk) { return rows_smem_offset(d_qk) + kWarpgroups * kHeadsPerCta * 4; }

constexpr int64_t head_blocks(int64_t h_q) { return (h_q + kHeadsPerCta - 1) / kHeadsPerCta; }

}  // namespace sparse_mla::sm90
