// Tile shape of the SM90 narrow-head prefill kernels (h_q <= 32: one CTA per query token and all its
// heads, whose tensor work follows the heads asked for), shared by the kernels and the host that
// sizes their launch.
#pragma once
#include <stdint.h>

#include "precision.h"
#include "sm90/config.h"  // kSlotsPerTile, kDv

namespace sparse_mla::sm90::narrow {

constexpr int kMTileHeads = 16;      // heads of one m16n8k16 MMA tile as its M (rows past h_q are zero)
constexpr int kNTileHeads = 8;       // heads of one m16n8k16 MMA tile as its N (narrow8: columns past h_q are zero)
constexpr int kWarpsPerMTile = 4;    // each: S of 16 slots of a tile (by pairs), P.V on 128 columns of d_v
constexpr int kGroupThreads = kWarpsPerMTile * 32;  // the warps of one M tile: a named barrier's threads
constexpr int kMaxBuffers = 4;       // the ring's depth where shared memory allows (2 is as fast: PERF.md)
// Two producer warps, the gather's issue on two schedulers instead of on the one that a consumer warp
// shares with it (whose lag the group's per-tile barrier passes on to every warp): 2-3.5% faster on
// narrow16's serving shapes, narrow8 unchanged (PERF.md, narrow v7).
constexpr int kProducerWarps = 2;
// A producer lane's rows of a tile: lane / 4 + 8 (kProducerWarps k + its warp), k < kRowSets.
constexpr int kRowSets = kSlotsPerTile / 8 / kProducerWarps;
// The producer warps' named barrier (the consumers' are 1 .. 3 x their M tiles: heads_as_m.cuh).
constexpr int kProducersBar = 15;
// The CTA's words of its items beside the ring's mbarriers (RingBarriers): the Q tile's item and the
// two slots of the next item's claim.
constexpr int kRingWords = 3;

// A CTA of kHeads heads: 8 heads as the MMA's N (one group of 4 consumer warps), or kHeads / 16 M
// tiles of 16 heads, 4 consumer warps each; and the producer warps. One group runs two CTAs per SM
// (two consumer warps per SMSP to hide the latencies).
template <int kHeads_>
struct Shape {
    static constexpr int kHeads = kHeads_;
    static_assert(kHeads == kNTileHeads || kHeads % kMTileHeads == 0, "8 heads, or whole M tiles");
    static constexpr bool kHeadsAsN = kHeads == kNTileHeads;
    static constexpr int kGroups = kHeadsAsN ? 1 : kHeads / kMTileHeads;
    static constexpr int kConsumerWarps = kWarpsPerMTile * kGroups;
    static constexpr int kConsumerThreads = kConsumerWarps * 32;
    static constexpr int kThreads = kConsumerThreads + 32 * kProducerWarps;
    static constexpr int kCtasPerSm = kGroups == 1 ? 2 : 1;
    // what the consumer warps exchange per tile, in one of two buffers: heads as N, S^T (fp32, kHeads
    // x 64 slots); heads as M, per group each warp's P as the A fragments of its 16 slots (fp16, 512
    // bytes a warp) and each row's maximum over each warp's slots (fp32); and, at an item's end, each
    // row's sum over each warp's slots (heads as M)
    static constexpr int kMExchangeBytes = kWarpsPerMTile * 32 * 16 + kMTileHeads * 16;  // one group's
    static constexpr int kExchangeBytes = kHeadsAsN ? kHeads * kSlotsPerTile * 4 : kGroups * kMExchangeBytes;
    // heads as M, per group: each warp's partial S of the 16 slots its pair partner owns (fp32, 8 a
    // lane), the pair's two halves of d_qk added by the owner
    static constexpr int kPartialBytes = kHeadsAsN ? 0 : kGroups * kWarpsPerMTile * 32 * 8 * 4;
    static constexpr int kSumsBytes = kHeadsAsN ? 0 : kGroups * kMTileHeads * 16;
};

// An SM's 228 KB of shared memory less the 1 KB it keeps per CTA, shared by kCtas CTAs.
constexpr int smem_limit(int ctas) { return ctas == 1 ? 227 * 1024 : 228 * 1024 / ctas - 1024; }

// Shared memory of one CTA (byte offsets):
//   the ring: kBuffers landing tiles [slot][d_qk] e4m3 in 64-byte column atoms, 16-byte chunks
//     swizzled so that ldmatrix reads 8 rows of one chunk conflict-free;
//   the Q tile [head][d_qk] e4m3 (the producer loads the next item's once the consumers took this one's);
//   the mbarriers of the ring and of Q, and the words of the CTA's items (RingBarriers);
//   the ring's validity words: per tile, each producer warp's ballot of its rows' validity for each
//     of its row sets k (RingValidity);
//   Q in fp16, in the order of the MMA's fragments (per 16-column chunk and lane);
//   what the consumers exchange per tile (Shape::kExchangeBytes), double-buffered, and at an item's end;
//   heads as M, the pairs' partial S (Shape::kPartialBytes).
// The probe of the gather floor (ci/probes) uses only what comes before q16.
template <int D, int kHeads, int kBuffersOverride = 0, int kCtas = Shape<kHeads>::kCtasPerSm>
struct Layout {
    static_assert(D % 64 == 0 && D >= kDv, "d_qk in whole 64-byte atoms, holding d_v");
    static constexpr int kTileBytes = kSlotsPerTile * D;
    static constexpr int kQ8Bytes = kHeads * D;
    static constexpr int kQ16Bytes = kHeads * D * 2;
    static constexpr int kXBytes = Shape<kHeads>::kExchangeBytes;
    static constexpr int kSumsBytes = Shape<kHeads>::kSumsBytes;
    static constexpr int kPartialBytes = Shape<kHeads>::kPartialBytes;
    static constexpr int kFixed = kQ8Bytes + 256 + kQ16Bytes + 2 * kXBytes + kSumsBytes + kPartialBytes;
    static constexpr int kFit = (smem_limit(kCtas) - kFixed) / kTileBytes;
    static constexpr int kBuffers = kBuffersOverride ? kBuffersOverride : (kFit < kMaxBuffers ? kFit : kMaxBuffers);
    static_assert(kBuffers >= 2, "a ring of two tiles at least");
    static constexpr int kLanding = 0;
    static constexpr int kQ8 = kBuffers * kTileBytes;
    static constexpr int kBarriers = kQ8 + kQ8Bytes;  // full[kBuffers], empty[kBuffers], q_full, q_empty, the words
    static constexpr int kBarrierBytes = (2 * kBuffers + 2 + kRingWords) * 8;
    static constexpr int kValid = kBarriers + kBarrierBytes;
    static constexpr int kValidBytes = kBuffers * kRowSets * kProducerWarps * 4;
    static constexpr int kQ16 = (kValid + kValidBytes + 127) / 128 * 128;
    static constexpr int kX = kQ16 + kQ16Bytes;
    static constexpr int kSums = kX + 2 * kXBytes;
    static constexpr int kPartial = kSums + kSumsBytes;
    static constexpr int kBytes = kPartial + kPartialBytes;
    static constexpr int kGatherBytes = kQ16;  // what the floor's probe uses
    static_assert(kBytes <= smem_limit(kCtas), "shared memory");
};

// The registry's entries (kernels/registry.h), first in its list: 8 heads as the MMA's N take
// h_q <= 8, one M tile h_q <= 16, two h_q <= 32; O in fp32, so any topk. (An exact kernel: it
// takes both precisions.)
template <int kHeads>
struct Traits {
    static constexpr int kThreads = Shape<kHeads>::kThreads;
    static constexpr int kCtasPerSm = Shape<kHeads>::kCtasPerSm;
    static constexpr int kHeadsPerCta = kHeads;
    static constexpr bool kClaimsItems = true;  // from SparseMlaParams::item_counter
    static constexpr int smem_bytes(int d_qk) { return d_qk <= 512 ? Layout<512, kHeads>::kBytes : Layout<576, kHeads>::kBytes; }
    static constexpr bool takes(int64_t h_q, int64_t, Precision) { return h_q <= kHeadsPerCta; }
};

}  // namespace sparse_mla::sm90::narrow

namespace sparse_mla::sm90::narrow8 {
using Traits = narrow::Traits<8>;
}
namespace sparse_mla::sm90::narrow16 {
using Traits = narrow::Traits<16>;
}
namespace sparse_mla::sm90::narrow32 {
using Traits = narrow::Traits<32>;
}
