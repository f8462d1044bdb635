// What the SM90 kernels share: the tile of slots, the warpgroups, a consumer warpgroup's heads, the
// K of a wgmma, and the roles a kernel's traits derive from (each kernel's own shape is in its
// folder's config.h; the list of kernels in kernels/registry.h).
#pragma once
#include <stdint.h>

namespace sparse_mla::sm90 {

constexpr int kSlotsPerTile = 64;  // topk slots gathered per main-loop step
constexpr int kDv = 512;
constexpr int kWarpgroupThreads = 128;
constexpr int kHeadsPerWg = 64;  // the heads of a consumer warpgroup, the M of its wgmmas (rows past h_q are masked)
constexpr int kKStep = 32;       // K of one FP8 wgmma
constexpr int kQkSets = 3;       // register sets of QK^T's per-K-step sums: two wgmmas run while one is added

constexpr int e4m3_tile_bytes(int d_qk) { return kSlotsPerTile * d_qk; }

// The blocks of heads_per_cta heads that a token's h_q heads take: with the tokens, the work items.
constexpr int64_t head_blocks(int64_t h_q, int64_t heads_per_cta) { return (h_q + heads_per_cta - 1) / heads_per_cta; }

// A kernel's CTA by role: kConsumers consumer warpgroups and one producer warpgroup (it gathers the kv
// tiles and converts V to fp16), kCtas CTAs per SM, and the registers setmaxnreg gives each role (the
// producer gives its registers to the math). A kernel's Traits derive from it.
template <int kConsumers, int kCtas, int kProducerRegs, int kConsumerRegs>
struct WarpgroupRoles {
    static constexpr int kConsumerWarpgroups = kConsumers;
    static constexpr int kConsumerThreads = kConsumers * kWarpgroupThreads;
    static constexpr int kProducerThreads = kWarpgroupThreads;
    static constexpr int kThreads = kConsumerThreads + kProducerThreads;
    static constexpr int kCtasPerSm = kCtas;
    static constexpr int kProducerRegisters = kProducerRegs;
    static constexpr int kConsumerRegisters = kConsumerRegs;
    static_assert(kCtas * (kProducerThreads * kProducerRegs + kConsumerThreads * kConsumerRegs) <= 65536, "an SM's registers");
};

}  // namespace sparse_mla::sm90
