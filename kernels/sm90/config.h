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

// The K steps that precision "fast" lets the tensor cores sum before a promotion: up to `most` (4:
// 128 of d_qk, as DeepSeek-V3's FP8 GEMMs promote), whole sums, and more sums than kQkSets.
constexpr int fast_steps_per_sum(int d_qk, int most = 4) {
    int n = most;
    while (n > 1 && (d_qk / kKStep % n != 0 || d_qk / kKStep / n <= kQkSets)) --n;
    return n;
}
static_assert(fast_steps_per_sum(512) == 4 && fast_steps_per_sum(576) == 3, "d_qk 512: 4 sums of 4; 576: 6 of 3");

constexpr int e4m3_tile_bytes(int d_qk) { return kSlotsPerTile * d_qk; }
// precision "fast": V^T of a half tile (32 slots) in e4m3, the B of an FP8 P.V (device_helpers.cuh's VtTile)
constexpr int kVtTileBytes = kSlotsPerTile / 2 * kDv;

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
    static constexpr bool kClaimsItems = false;  // items in turn (SparseMlaParams::item_counter unused)
    // setmaxnreg only moves registers within what the launch gave the CTA: __launch_bounds__'s count
    // per thread (65536 / (threads x CTAs per SM), down to a multiple of 8) for each of its threads.
    // An increase past that pool waits forever (consumers 240 / producer 32 of a 384-thread CTA hung:
    // 240 x 256 + 32 x 128 = 65536 > 168 x 384).
    static constexpr int kLaunchRegisters = 65536 / (kCtas * kThreads) / 8 * 8;
    static_assert(kProducerThreads * kProducerRegs + kConsumerThreads * kConsumerRegs <= kThreads * kLaunchRegisters,
                  "the roles' registers within the CTA's launch pool");
};

}  // namespace sparse_mla::sm90
