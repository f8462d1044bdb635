// The SM90 64-head prefill kernel's entry in the registry (kernels/registry.h): its tile shape is
// sm90/config.h's, which the other kernels share.
#pragma once
#include <stdint.h>

#include "precision.h"
#include "sm90/config.h"

namespace sparse_mla::sm90::fallback {

struct Traits {
    static constexpr int kThreads = sm90::kThreads;
    static constexpr int kCtasPerSm = 1;
    static constexpr int kHeadsPerCta = sm90::kHeadsPerCta;
    static constexpr int smem_bytes(int d_qk) { return sm90::smem_bytes(d_qk); }
    // Every call: the registry's last entry, for the calls that no kernel before it takes (its O in
    // fp32 holds the contract's bounds at any topk). An exact kernel, so both precisions.
    static constexpr bool takes(int64_t, int64_t, Precision) { return true; }
};

}  // namespace sparse_mla::sm90::fallback
