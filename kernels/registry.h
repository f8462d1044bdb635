// The kernel registry: the SM90 kernels in dispatch order, each a traits type (sm90/<name>/config.h:
// threads, CTAs per SM, heads per CTA, smem_bytes(d_qk), takes(h_q, topk, precision)) and its device
// entry sm90::<name>::prefill<D> (sm90/<name>/prefill_kernel.cuh). This one list drives the host's
// choice (the first entry that takes a call runs it) and every d_qk's fatbin, which holds one entry
// per line with the traits' launch bounds (sm90/prefill_instance.cu.in). Host code only: the CPU-only
// build answers which kernel a call would run, too.
//
// Adding a kernel: its folder (traits in config.h, device code in prefill_kernel.cuh), its include
// below and one line in the list. The checks at the end fail the build if the list does not end in a
// kernel that takes every call, or if an entry takes no call that an earlier one leaves.
#pragma once
#include <stdint.h>

#include <string>
#include <string_view>

#include "precision.h"
#include "sm90/dual/config.h"
#include "sm90/fallback/config.h"
#include "sm90/narrow/config.h"
#include "sm90/split/config.h"
#include "sm90/wide/config.h"
#include "sm90/wide_fast/config.h"

// X(name) per kernel, in dispatch order. A fast kernel (named *_fast) takes only precision "fast" and
// comes before the exact kernels that would take its calls; an exact kernel takes both precisions.
#define SPARSE_MLA_SM90_KERNELS(X) \
    X(narrow8)                     \
    X(narrow16)                    \
    X(narrow32)                    \
    X(wide_fast)                   \
    X(wide)                        \
    X(dual_fast)                   \
    X(dual)                        \
    X(split)                       \
    X(fallback)

namespace sparse_mla {

// A kernel's entry in a fatbin: kEntryPrefix, d_qk, "_", its name (e.g. sparse_mla_fp8_prefill_d576_wide).
inline constexpr const char* kEntryPrefix = "sparse_mla_fp8_prefill_d";

struct KernelSpec {
    const char* name;
    int threads, ctas_per_sm, heads_per_cta;
    bool claims_items;  // from SparseMlaParams::item_counter (else items in turn)
    int (*smem_bytes)(int d_qk);
    bool (*takes)(int64_t h_q, int64_t topk, Precision precision);

    int64_t head_blocks(int64_t h_q) const { return sm90::head_blocks(h_q, heads_per_cta); }
    std::string entry(int64_t d_qk) const { return kEntryPrefix + std::to_string(d_qk) + "_" + name; }
};

inline constexpr KernelSpec kKernels[] = {
#define SPARSE_MLA_SPEC(name)                                                                     \
    {#name, sm90::name::Traits::kThreads, sm90::name::Traits::kCtasPerSm,                         \
     sm90::name::Traits::kHeadsPerCta, sm90::name::Traits::kClaimsItems,                          \
     &sm90::name::Traits::smem_bytes, &sm90::name::Traits::takes},
    SPARSE_MLA_SM90_KERNELS(SPARSE_MLA_SPEC)
#undef SPARSE_MLA_SPEC
};
inline constexpr int kNumKernels = sizeof(kKernels) / sizeof(kKernels[0]);

// The kernel that runs a call: the first that takes it.
constexpr const KernelSpec& kernel_for(int64_t h_q, int64_t topk, Precision precision) {
    int i = 0;
    while (i < kNumKernels - 1 && !kKernels[i].takes(h_q, topk, precision)) ++i;
    return kKernels[i];
}

// The kernel of this name, or null.
inline const KernelSpec* kernel_named(std::string_view name) {
    for (const KernelSpec& k : kKernels)
        if (name == k.name) return &k;
    return nullptr;
}

namespace registry_checks {

// Whether `entry` is named kEntryPrefix + d_qk + "_" + name: the fatbin's entries are checked against
// the host's names at compile time (prefill_instance.cu.in).
constexpr bool is_entry(const char* entry, int d_qk, const char* name) {
    const char* p = kEntryPrefix;
    while (*p)
        if (*entry++ != *p++) return false;
    char digits[12] = {};
    int n = 0;
    for (int d = d_qk; d > 0; d /= 10) digits[n++] = static_cast<char>('0' + d % 10);
    while (n > 0)
        if (*entry++ != digits[--n]) return false;
    if (*entry++ != '_') return false;
    while (*name)
        if (*entry++ != *name++) return false;
    return *entry == '\0';
}

// The calls the checks below try: every h_q up to kMaxHeads, and every topk 2^k - 1, 2^k, 2^k + 1
// (the bounds of the takes() are powers of two), both precisions.
constexpr int64_t kMaxHeads = 320;
constexpr int kMaxLog2Topk = 20;
constexpr Precision kPrecisions[] = {Precision::exact, Precision::fast};

template <class F>
constexpr bool for_every_call(F f) {
    for (Precision precision : kPrecisions)
        for (int64_t h_q = 1; h_q <= kMaxHeads; ++h_q)
            for (int k = 0; k <= kMaxLog2Topk; ++k)
                for (int64_t topk : {(int64_t{1} << k) - 1, int64_t{1} << k, (int64_t{1} << k) + 1})
                    if (topk > 0 && !f(h_q, topk, precision)) return false;
    return true;
}

constexpr bool last_takes_every_call() {
    return for_every_call([](int64_t h_q, int64_t topk, Precision precision) {
        return kKernels[kNumKernels - 1].takes(h_q, topk, precision);
    });
}

// one pass over the calls, a bit per kernel that runs one (a pass per kernel passes the compilers'
// limits on constant evaluation)
constexpr bool every_kernel_runs_some_call() {
    static_assert(kNumKernels <= 32, "a bit per kernel");
    uint32_t ran = 0;
    for_every_call([&ran](int64_t h_q, int64_t topk, Precision precision) {
        ran |= 1u << (&kernel_for(h_q, topk, precision) - kKernels);
        return true;
    });
    return ran == (kNumKernels == 32 ? ~0u : (1u << kNumKernels) - 1);
}

static_assert(last_takes_every_call(), "the registry's last kernel must take every call");
static_assert(every_kernel_runs_some_call(), "a kernel of the registry takes no call that the ones before it leave");

}  // namespace registry_checks
}  // namespace sparse_mla
