// Tile shape and traits of the SM90 dual prefill kernel (two CTAs per SM, each one query token x 64
// heads with one consumer warpgroup), shared by the kernel and the registry (kernels/registry.h).
#pragma once
#include <stdint.h>

#include "precision.h"
#include "sm90/config.h"
#include "sm90/wide/config.h"

namespace sparse_mla::sm90::dual {

constexpr int kHeadsPerCta = kHeadsPerWg;       // one consumer warpgroup: 64 heads, all of d_v
constexpr int kHalfSlots = kSlotsPerTile / 2;  // the unit of the ring: a half tile of 32 slots
// e4m3 kv half tiles: the gather runs two half tiles ahead where shared memory allows (at d_qk 576
// only beside fast's e4m3 V^T, half the bytes of the fp16 V)
constexpr int kMaxLandingBuffers = 3;
constexpr int landing_buffers(int d_qk, bool fast) { return d_qk <= 512 || fast ? kMaxLandingBuffers : 2; }

// Shared memory, each wgmma operand 1024-byte aligned for its swizzle:
//   one fp16 half tile [slot][kDv]: V of a half tile, the MN-major B of P.V (P comes from registers),
//   or (fast) one e4m3 V^T half tile (a VtTile);
//   landing_buffers e4m3 kv half tiles [slot][d_qk], K-major B of QK^T in 64-byte swizzle atoms;
//   Q [head][d_qk] in e4m3, the A of QK^T in the same atoms.
constexpr int half_tile_bytes(int d_qk) { return kHalfSlots * d_qk; }
constexpr int landing_smem_offset(bool fast) { return fast ? kVtTileBytes : kHalfSlots * kDv * 2; }
constexpr int q_smem_offset(int d_qk, bool fast) {
    return landing_smem_offset(fast) + landing_buffers(d_qk, fast) * half_tile_bytes(d_qk);
}
constexpr int smem_bytes(int d_qk, bool fast) { return q_smem_offset(d_qk, fast) + kHeadsPerCta * d_qk; }

// Its entry in the registry, before the split kernel's: it takes the calls with one block of 64 heads
// up to where its f16 O (the wide kernel's) is accurate enough; the split kernel takes longer rows. At
// short rows too: there the per-item end is the kernel, and two CTAs per SM hide part of it (faster
// than the fallback kernel at every short topk measured: PERF.md). (An exact kernel:
// it takes both precisions, after dual_fast has taken fast's.) Two CTAs per SM, so that while one CTA runs
// its epilogue the other's wgmmas run: 65536 registers / 2 / 128 = 256 per consumer and producer
// thread pair.
struct Traits : WarpgroupRoles<1, 2, 40, 216> {
    static constexpr int kHeadsPerCta = dual::kHeadsPerCta;
    static constexpr int smem_bytes(int d_qk) { return dual::smem_bytes(d_qk, false); }
    static constexpr bool takes(int64_t h_q, int64_t topk, Precision) {
        return h_q <= kHeadsPerCta && topk <= wide::kMaxTopk;
    }
};
// two CTAs' shared memory and the 1 KB the SM reserves for each
static_assert(Traits::kCtasPerSm * (smem_bytes(512, false) + 1024) <= 228 * 1024 &&
                  Traits::kCtasPerSm * (smem_bytes(576, false) + 1024) <= 228 * 1024 &&
                  Traits::kCtasPerSm * (smem_bytes(576, true) + 1024) <= 228 * 1024,
              "an SM's shared memory");

}  // namespace sparse_mla::sm90::dual

namespace sparse_mla::sm90::dual_fast {

// The dual kernel under precision "fast" (dual::prefill's kFast): the calls the dual kernel takes,
// in that precision; before it in the registry.
struct Traits : dual::Traits {
    static constexpr int smem_bytes(int d_qk) { return dual::smem_bytes(d_qk, true); }
    static constexpr bool takes(int64_t h_q, int64_t topk, Precision precision) {
        return precision == Precision::fast && dual::Traits::takes(h_q, topk, precision);
    }
};

}  // namespace sparse_mla::sm90::dual_fast
