// Tile shape of the SM90 prefill kernel, shared by the kernel and the host that sizes its launch.
#pragma once
#include <stdint.h>

namespace sparse_mla::sm90 {

constexpr int kHeadsPerCta = 64;   // one CTA: one query token x 64 heads (rows past h_q are masked)
constexpr int kSlotsPerTile = 64;  // topk slots gathered per main-loop step
constexpr int kDv = 512;
constexpr int kWarps = 8;          // 4 head groups of 16 rows x 2 halves of d_v
constexpr int kThreads = kWarps * 32;
constexpr int kRowPad = 16;        // bytes added to each fp8 row: conflict-free 4-byte fragment loads
constexpr int kVtPad = 8;          // halves added to each transposed-V row: conflict-free ldmatrix

constexpr int fp8_row_bytes(int d_qk) { return d_qk + kRowPad; }
constexpr int vt_row_halves() { return kSlotsPerTile + kVtPad; }

// Shared memory: Q tile, K tile (fp8), V^T tile (fp16), per-slot kv row and logit bias.
constexpr int q_smem_offset(int) { return 0; }
constexpr int k_smem_offset(int d_qk) { return kHeadsPerCta * fp8_row_bytes(d_qk); }
constexpr int vt_smem_offset(int d_qk) { return k_smem_offset(d_qk) + kSlotsPerTile * fp8_row_bytes(d_qk); }
constexpr int slot_smem_offset(int d_qk) { return vt_smem_offset(d_qk) + kDv * vt_row_halves() * 2; }
constexpr int smem_bytes(int d_qk) { return slot_smem_offset(d_qk) + kSlotsPerTile * (4 + 4); }

constexpr int64_t head_blocks(int64_t h_q) { return (h_q + kHeadsPerCta - 1) / kHeadsPerCta; }

}  // namespace sparse_mla::sm90
