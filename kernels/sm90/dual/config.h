// Tile shape of the SM90 dual prefill kernel (two CTAs per SM, each one query token x 64 heads with
// one consumer warpgroup), shared by the kernel and the host that sizes its launch. What it does not
// name is the 64-head kernel's (sm90/config.h): the tile of slots, the warpgroup size.
#pragma once
#include <stdint.h>

#include "precision.h"
#include "sm90/config.h"
#include "sm90/wide/config.h"

namespace sparse_mla::sm90::dual {

constexpr int kCtasPerSm = 2;  // while one CTA runs its epilogue, the other's wgmmas run
constexpr int kHeadsPerCta = 64;
constexpr int kConsumerThreads = kWarpgroupThreads;  // one consumer warpgroup: 64 heads, all of d_v
constexpr int kProducerThreads = kWarpgroupThreads;  // gathers kv half tiles, converts V to fp16
constexpr int kThreads = kConsumerThreads + kProducerThreads;
// 65536 registers / kCtasPerSm / kWarpgroupThreads = 256 per consumer and producer thread pair
constexpr int kProducerRegisters = 40;
constexpr int kConsumerRegisters = 216;
static_assert(kCtasPerSm * kWarpgroupThreads * (kProducerRegisters + kConsumerRegisters) <= 65536, "an SM's registers");
constexpr int kHalfSlots = kSlotsPerTile / 2;  // the unit of the ring: a half tile of 32 slots
// e4m3 kv half tiles: the gather runs two half tiles ahead where shared memory allows
constexpr int kMaxLandingBuffers = 3;
constexpr int landing_buffers(int d_qk) { return d_qk <= 512 ? kMaxLandingBuffers : 2; }

// Shared memory, each wgmma operand 1024-byte aligned for its swizzle:
//   one fp16 half tile [slot][kDv]: V of a half tile, the MN-major B of P.V (P comes from registers);
//   landing_buffers e4m3 kv half tiles [slot][d_qk], K-major B of QK^T in 64-byte swizzle atoms;
//   Q [head][d_qk] in e4m3, the A of QK^T in the same atoms.
constexpr int half_tile_bytes(int d_qk) { return kHalfSlots * d_qk; }
constexpr int landing_smem_offset(int) { return kHalfSlots * kDv * 2; }
constexpr int q_smem_offset(int d_qk) { return landing_smem_offset(d_qk) + landing_buffers(d_qk) * half_tile_bytes(d_qk); }
constexpr int smem_bytes(int d_qk) { return q_smem_offset(d_qk) + kHeadsPerCta * d_qk; }
// two CTAs' shared memory and the 1 KB the SM reserves for each
static_assert(kCtasPerSm * (smem_bytes(512) + 1024) <= 228 * 1024 && kCtasPerSm * (smem_bytes(576) + 1024) <= 228 * 1024,
              "an SM's shared memory");

constexpr int64_t head_blocks(int64_t h_q) { return (h_q + kHeadsPerCta - 1) / kHeadsPerCta; }

// Below this the 64-head kernel keeps the small shapes (and the tests' coverage).
constexpr int64_t kMinTopk = 256;

// Its entry in the registry (kernels/registry.h), after the split kernel's: it takes the calls with
// one block of 64 heads from kMinTopk slots on that the split kernel does not, where the 64-head
// kernel's per-item epilogue bounds it, up to where its f16 O (the wide kernel's) is accurate enough.
// (An exact kernel: it takes both precisions until fast kernels exist.)
struct Traits {
    static constexpr int kThreads = dual::kThreads;
    static constexpr int kCtasPerSm = dual::kCtasPerSm;
    static constexpr int kHeadsPerCta = dual::kHeadsPerCta;
    static constexpr int smem_bytes(int d_qk) { return dual::smem_bytes(d_qk); }
    static constexpr bool takes(int64_t h_q, int64_t topk, Precision) {
        return h_q <= kHeadsPerCta && topk >= kMinTopk && topk <= wide::kMaxTopk;
    }
};

}  // namespace sparse_mla::sm90::dual
