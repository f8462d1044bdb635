#include "prefill_cpu.h"

#include <algorithm>
#include <array>
#include <atomic>
#include <chrono>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <iterator>
#include <limits>
#include <stdexcept>
#include <string>
#include <system_error>
#include <thread>
#include <vector>

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#define SPARSE_MLA_CPU_X86 1
#include <immintrin.h>
#else
#define SPARSE_MLA_CPU_X86 0
#endif

namespace {

// Heads are the vector lanes: each gathered KV row is decoded once and then serves every head of the
// token, and each lane's arithmetic is the same whatever the vector width, so a head's result does
// not depend on how its heads were blocked, on the instruction set, or on the thread count.
using f32x16 = float __attribute__((vector_size(64)));
using f32x8 = float __attribute__((vector_size(32)));
using f32x4 = float __attribute__((vector_size(16)));
constexpr int64_t kMaxLanes = 16;  // the widest vector's heads

// Valid KV rows decoded at a time (64 x 576 floats, in L2 while every head block consumes them); an
// online softmax joins the chunks, so memory does not grow with topk.
constexpr int64_t kChunk = 64;
constexpr int64_t kCacheLine = 64;
// Work items per thread, so that tokens of unequal topk_length still share out evenly.
constexpr int64_t kItemsPerThread = 4;
// How often the calling thread asks whether the caller was interrupted (Ctrl-C).
constexpr auto kPollInterval = std::chrono::milliseconds(20);

// Caps the instruction set (e.g. to compare entries, or to match another machine's results).
constexpr const char* kIsaVariable = "SPARSE_MLA_FP8_CPU_ISA";

constexpr float kInf = std::numeric_limits<float>::infinity();

template <class V>
constexpr int lanes_of = int(sizeof(V) / sizeof(float));

template <class V>
inline V load(const float* p) {
    V v;
    std::memcpy(&v, p, sizeof v);
    return v;
}

template <class V>
inline void store(float* p, V v) {
    std::memcpy(p, &v, sizeof v);
}

// Decoding gives e4m3 x 2^-8, the value of the byte's fp16 reading (below); the scales take the
// 2^8 back. Powers of two change no rounding: every product stays far above the fp32 subnormals.
constexpr float kDecoded = 0x1p-8f;

std::array<float, 256> make_e4m3fn_table() {
    std::array<float, 256> t{};
    for (int b = 0; b < 256; ++b) {
        const int e = (b >> 3) & 0xf, m = b & 7;
        float mag;
        if (e == 0xf && m == 7)
            mag = std::numeric_limits<float>::quiet_NaN();  // e4m3fn has NaN but no inf
        else if (e == 0)
            mag = std::ldexp(float(m), -9);  // subnormal: m/8 * 2^-6
        else
            mag = std::ldexp(float(8 + m), e - 10);  // (1 + m/8) * 2^(e-7)
        t[b] = (b & 0x80) ? -mag * kDecoded : mag * kDecoded;
    }
    return t;
}

// The entry without F16C (and the tails of rows, which are multiples of 16 bytes in practice).
inline void decode_table(const uint8_t* src, float* dst, int64_t n) {
    static const std::array<float, 256> table = make_e4m3fn_table();
    for (int64_t i = 0; i < n; ++i) dst[i] = table[src[i]];
}

#if SPARSE_MLA_CPU_X86
// 16 e4m3fn bytes as fp16 bits: e4m3's 4 exponent and 3 mantissa bits, shifted by 7, are fp16's
// fields of the same value x 2^-8 (bias 15 for 7), subnormals included; 0x7f/0xff become NaN.
__attribute__((target("avx2"))) inline __m256i e4m3_as_fp16(const uint8_t* src) {
    const __m256i b = _mm256_cvtepu8_epi16(_mm_loadu_si128(reinterpret_cast<const __m128i*>(src)));
    const __m256i mag = _mm256_and_si256(b, _mm256_set1_epi16(0x7f));
    const __m256i sign = _mm256_slli_epi16(_mm256_and_si256(b, _mm256_set1_epi16(0x80)), 8);
    const __m256i nan = _mm256_and_si256(_mm256_cmpeq_epi16(mag, _mm256_set1_epi16(0x7f)), _mm256_set1_epi16(0x7e00));
    return _mm256_or_si256(_mm256_or_si256(_mm256_slli_epi16(mag, 7), sign), nan);
}

// fp16 to fp32 in hardware (VCVTPH2PS is exact and ignores MXCSR's denormals-are-zero).
__attribute__((target("avx512f,avx2"))) inline void decode_avx512(const uint8_t* src, float* dst, int64_t n) {
    int64_t i = 0;
    for (; i + 16 <= n; i += 16) _mm512_storeu_ps(dst + i, _mm512_cvtph_ps(e4m3_as_fp16(src + i)));
    decode_table(src + i, dst + i, n - i);
}

__attribute__((target("avx2,f16c"))) inline void decode_avx2(const uint8_t* src, float* dst, int64_t n) {
    int64_t i = 0;
    for (; i + 16 <= n; i += 16) {
        const __m256i h = e4m3_as_fp16(src + i);
        _mm256_storeu_ps(dst + i, _mm256_cvtph_ps(_mm256_castsi256_si128(h)));
        _mm256_storeu_ps(dst + i + 8, _mm256_cvtph_ps(_mm256_extracti128_si256(h, 1)));
    }
    decode_table(src + i, dst + i, n - i);
}
#endif

// Each entry's decode, named by its head vector V.
template <class V>
inline void decode_e4m3(const uint8_t* src, float* dst, int64_t n) {
#if SPARSE_MLA_CPU_X86
    if constexpr (lanes_of<V> == 16)
        return decode_avx512(src, dst, n);
    else if constexpr (lanes_of<V> == 8)
        return decode_avx2(src, dst, n);
#endif
    decode_table(src, dst, n);
}

// exp(x) for x <= 0, -inf or NaN, every lane at once (a call of expf per logit would cost a third of
// the FMAs' time): x = n ln2 + r, e^r by Cephes' polynomial on |r| <= ln2 / 2 (1-2 ulp), 2^n built in
// the exponent bits. Results below 2^-126 (x < -87) flush to 0: beside the row's maximum term, 1,
// they are nothing.
template <class V>
inline V exp_nonpositive(V x) {
    using I = decltype(x < x);  // the signed integer vector of V's lanes
    constexpr float kRound = 0x1.8p23f;  // added, it leaves round(x / ln2) in the low mantissa bits
    const I underflow = x < -87.0f;
    x = underflow ? V{} : x;
    const V t = x * 1.44269504088896341f + kRound;
    const V n = t - kRound;
    V r = x - n * 0.693359375f;  // ln2 in two parts, so that n * ln2 is exact in the first
    r = r - n * -2.12194440e-4f;
    V p = V{} + 1.9875691500e-4f;
    p = p * r + 1.3981999507e-3f;
    p = p * r + 8.3334519073e-3f;
    p = p * r + 4.1665795894e-2f;
    p = p * r + 1.6666665459e-1f;
    p = p * r + 5.0000001201e-1f;
    p = p * r * r + r + 1.0f;
    I bits;
    std::memcpy(&bits, &t, sizeof bits);
    const I scale_bits = (bits - 0x4b400000 + 127) << 23;
    V scale;
    std::memcpy(&scale, &scale_bits, sizeof scale);
    return underflow ? V{} : p * scale;
}

uint16_t to_bf16_bits(float f) {
    uint32_t u;
    std::memcpy(&u, &f, sizeof u);
    if ((u & 0x7fffffffu) > 0x7f800000u) return uint16_t((u >> 16) | 0x40);  // keep NaN a (quiet) NaN
    u += 0x7fffu + ((u >> 16) & 1);                                          // round to nearest even
    return uint16_t(u >> 16);
}

int64_t round_up(int64_t x, int64_t m) { return (x + m - 1) / m * m; }

// acc[r] += a[k] * b[k * b_k + r * b_r] for k < depth: R independent vectors of heads, each FMA
// sharing one load of a (one head vector per k) and one broadcast of b; the sum over k keeps its order.
template <class V, int R>
inline void panel(V (&acc)[R], const float* a, const float* b, int64_t b_k, int64_t b_r, int64_t depth) {
    constexpr int L = lanes_of<V>;
    for (int64_t k = 0; k < depth; ++k) {
        const V ak = load<V>(a + k * L);
        const float* bk = b + k * b_k;
        for (int r = 0; r < R; ++r) acc[r] += ak * bk[r * b_r];
    }
}

// Computes work items, each the heads [h0, h1) of one token: every result is finished by one worker,
// in an order that depends only on the inputs.
class Worker {
public:
    Worker(const SparseMlaParams& p, float logit_scale, float kv_scale, int64_t max_heads)
        : p_(p),
          logit_scale_(logit_scale / (kDecoded * kDecoded)),
          kv_scale_(kv_scale / kDecoded),
          ld_(round_up(p.d_qk, kMaxLanes)),
          dv_(round_up(p.d_v, kMaxLanes)),
          heads_(round_up(max_heads, kMaxLanes)),  // the item's heads, padded to whole blocks
          rows_(size_t(kChunk * ld_), 0.0f),  // rows and columns past the decoded ones stay finite
          q_row_(size_t(p.d_qk)),
          qt_(size_t(heads_ * p.d_qk)),
          st_(size_t(kChunk * kMaxLanes)),
          ot_(size_t(heads_ * dv_)),
          m_(size_t(heads_)),
          l_(size_t(heads_)) {}

    // Head blocks are vectors V, the last one H (half as wide) where that holds its heads; R is the
    // register block (rows, or V columns). The caller picks all three per instruction set. Block b's
    // scratch starts at its first head, b * L: [lanes] of m_ and l_, [d_qk][lanes] of qt_,
    // [dv][lanes] of ot_.
    template <class V, class H, int R>
    void item(int64_t t, int64_t h0, int64_t h1) {
        constexpr int64_t L = lanes_of<V>;
        const int64_t nh = h1 - h0;
        const int64_t blocks = round_up(nh, L) / L;
        auto lanes = [&](int64_t b) { return nh - b * L > lanes_of<H> ? L : int64_t(lanes_of<H>); };
        for (int64_t b = 0; b < blocks; ++b) load_q<V>(t, h0 + b * L, std::min(h1, h0 + (b + 1) * L), b * L, lanes(b));
        std::fill(ot_.begin(), ot_.begin() + blocks * L * dv_, 0.0f);
        std::fill(m_.begin(), m_.begin() + blocks * L, -kInf);
        std::fill(l_.begin(), l_.begin() + blocks * L, 0.0f);

        int64_t n_slots = p_.topk;
        if (p_.topk_length)
            n_slots = std::clamp<int64_t>(p_.topk_length[t * p_.topk_length_stride], 0, p_.topk);
        const int32_t* idx = p_.indices + t * p_.indices_stride_s;

        int64_t valid = 0;
        for (int64_t i = 0; i < n_slots;) {
            int64_t n = 0;
            for (; i < n_slots && n < kChunk; ++i) {
                const int64_t j = idx[i];
                if (j < 0 || j >= p_.s_kv) continue;  // invalid slot: its row is never touched
                decode_e4m3<V>(p_.kv + j * p_.kv_stride_s, &rows_[size_t(n * ld_)], p_.d_qk);
                ++n;
            }
            if (n == 0) break;
            valid += n;
            prefetch_rows(idx, i, n_slots);
            for (int64_t b = 0; b < blocks; ++b) {
                if (lanes(b) == L)
                    block<V, R>(b * L, n);
                else
                    block<H, R>(b * L, n);
            }
        }
        for (int64_t b = 0; b < blocks; ++b) finish(t, h0 + b * L, std::min(h1, h0 + (b + 1) * L), b * L, lanes(b), valid);
    }

private:
    // Asks for the rows of the next chunk's valid slots from slot i on, into L2, while this chunk is
    // computed: rows are gathered at random, and a miss per row would otherwise stall the decode.
    void prefetch_rows(const int32_t* idx, int64_t i, int64_t n_slots) const {
        for (int64_t n = 0; i < n_slots && n < kChunk; ++i) {
            const int64_t j = idx[i];
            if (j < 0 || j >= p_.s_kv) continue;
            const uint8_t* row = p_.kv + j * p_.kv_stride_s;
            for (int64_t x = 0; x < p_.d_qk; x += kCacheLine) __builtin_prefetch(row + x, 0, 2);
            ++n;
        }
    }

    // Heads [h0, h1) of token t as the panel [d_qk][lanes] of the block from head `first` on; lanes
    // past h1 - h0 are 0.
    template <class V>
    void load_q(int64_t t, int64_t h0, int64_t h1, int64_t first, int64_t lanes) {
        float* qt = &qt_[size_t(first * p_.d_qk)];
        std::fill(qt, qt + p_.d_qk * lanes, 0.0f);
        for (int64_t h = h0; h < h1; ++h) {
            decode_e4m3<V>(p_.q + t * p_.q_stride_s + h * p_.q_stride_h, q_row_.data(), p_.d_qk);
            for (int64_t x = 0; x < p_.d_qk; ++x) qt[x * lanes + (h - h0)] = q_row_[size_t(x)];
        }
    }

    // Folds the chunk's n rows into the running softmax and the unnormalised sum of p * V of the
    // block from head `first` on.
    template <class V, int R>
    void block(int64_t first, int64_t n) {
        constexpr int L = lanes_of<V>;
        const float* qt = &qt_[size_t(first * p_.d_qk)];
        float* ot = &ot_[size_t(first * dv_)];
        float* st = st_.data();

        // Logits, R rows at a time; rows past n (stale or zero) are computed and dropped.
        for (int64_t r0 = 0; r0 < n; r0 += R) {
            V acc[R] = {};
            panel(acc, qt, &rows_[size_t(r0 * ld_)], 1, ld_, p_.d_qk);
            for (int r = 0; r < R; ++r) store(st + (r0 + r) * L, acc[r] * logit_scale_);
        }

        const V m_old = load<V>(&m_[size_t(first)]);
        // A NaN logit poisons the max, as in a float64 reference. (One condition per select: GCC
        // splits a select on two conditions into lanes before this is compiled for the entry's ISA.)
        V m = m_old;
        decltype(m < m) nan = {};
        for (int64_t c = 0; c < n; ++c) {
            const V s = load<V>(st + c * L);
            m = s > m ? s : m;
            nan |= s != s;
        }
        m = nan != 0 ? V{} + std::numeric_limits<float>::quiet_NaN() : m;
        // An all -inf row (only with absurd scales) must not turn exp(-inf - -inf) into NaN.
        const V shift = m == -kInf ? V{} : m;
        const V alpha = exp_nonpositive(m_old - shift);
        V sum = {};
        for (int64_t c = 0; c < n; ++c) {
            const V s = exp_nonpositive(load<V>(st + c * L) - shift);
            store(st + c * L, s);
            sum += s;
        }
        store(&l_[size_t(first)], load<V>(&l_[size_t(first)]) * alpha + sum);
        store(&m_[size_t(first)], m);

        // ot[x] = alpha * ot[x] + sum_c p_c * V_c[x], R columns at a time.
        for (int64_t x0 = 0; x0 < dv_; x0 += R) {
            V acc[R];
            for (int r = 0; r < R; ++r) acc[r] = load<V>(ot + (x0 + r) * L) * alpha;
            panel(acc, st, &rows_[size_t(x0)], ld_, 1, n);
            for (int r = 0; r < R; ++r) store(ot + (x0 + r) * L, acc[r]);
        }
    }

    void finish(int64_t t, int64_t h0, int64_t h1, int64_t first, int64_t lanes, int64_t valid) {
        const float* ot = &ot_[size_t(first * dv_)];
        for (int64_t h = h0; h < h1; ++h) {
            const int64_t lane = h - h0;
            uint16_t* out = p_.out + t * p_.out_stride_s + h * p_.out_stride_h;
            float& max_logit = p_.max_logits[t * p_.max_logits_stride_s + h * p_.max_logits_stride_h];
            float& lse = p_.lse[t * p_.lse_stride_s + h * p_.lse_stride_h];
            if (valid == 0) {
                std::fill(out, out + p_.d_v, uint16_t(0));
                max_logit = -kInf;
                lse = kInf;
                continue;
            }
            const float m = m_[size_t(first + lane)], l = l_[size_t(first + lane)];
            // The sink joins the denominator in the same max-shifted domain: -inf adds 0, +inf zeroes out.
            const float sink = p_.attn_sink ? std::exp(p_.attn_sink[h * p_.attn_sink_stride] - m) : 0.0f;
            const float f = kv_scale_ / (l + sink);
            for (int64_t x = 0; x < p_.d_v; ++x) out[x] = to_bf16_bits(ot[x * lanes + lane] * f);
            max_logit = m;
            lse = m + std::log(l);
        }
    }

    const SparseMlaParams& p_;
    const float logit_scale_, kv_scale_;
    const int64_t ld_, dv_, heads_;
    std::vector<float> rows_;   // [kChunk, ld] the chunk's decoded valid kv rows; V is their head
    std::vector<float> q_row_;  // [d_qk] one decoded q row
    std::vector<float> qt_;     // per block [d_qk][lanes] q of the item's heads, heads innermost
    std::vector<float> st_;     // [kChunk][lanes] one block's logits, then their exponentials
    std::vector<float> ot_;     // per block [dv][lanes] unnormalised sum of p * V (without kv_scale)
    std::vector<float> m_;      // [heads] running max logit per head
    std::vector<float> l_;      // [heads] running sum of exp(s - m) per head
};

// What the threads share: the items (each a token's group of heads), the next one to take, and
// whether to stop.
struct Items {
    const SparseMlaParams& p;
    int64_t group_heads, groups;
    std::atomic<int64_t> next{0};
    std::atomic<bool> stop{false};
};

// Takes items until there are none left or a stop is asked for; the calling thread (poll) also asks
// `interrupted` between items, at most once per kPollInterval.
template <class V, class H, int R>
inline void work(Worker& w, Items& items, const std::function<bool()>* poll) {
    const int64_t count = items.p.s_q * items.groups;
    auto last_poll = std::chrono::steady_clock::now();
    while (!items.stop.load(std::memory_order_relaxed)) {
        const int64_t i = items.next.fetch_add(1, std::memory_order_relaxed);
        if (i >= count) return;
        const int64_t t = i / items.groups, h0 = i % items.groups * items.group_heads;
        w.item<V, H, R>(t, h0, std::min(items.p.h_q, h0 + items.group_heads));
        if (poll && std::chrono::steady_clock::now() - last_poll >= kPollInterval) {
            if ((*poll)()) items.stop.store(true, std::memory_order_relaxed);
            last_poll = std::chrono::steady_clock::now();
        }
    }
}

// One entry per instruction set, each compiled for it with everything it calls inlined (flatten):
// the wheel runs on any x86-64 and uses AVX2 or AVX-512 where the CPU has them. Head blocks are the
// widest native vector (a wider one is lowered through memory); R accumulators plus a load fit the
// register file (AVX-512 has 32 registers, the others 16).
using WorkFn = void (*)(Worker&, Items&, const std::function<bool()>*);

#if SPARSE_MLA_CPU_X86
__attribute__((target("avx512f,avx512vl,avx2,fma,f16c"), flatten)) void work_avx512(
    Worker& w, Items& items, const std::function<bool()>* poll) {
    work<f32x16, f32x8, 16>(w, items, poll);
}
__attribute__((target("avx2,fma,f16c"), flatten)) void work_avx2(Worker& w, Items& items,
                                                            const std::function<bool()>* poll) {
    work<f32x8, f32x4, 8>(w, items, poll);
}
#endif
__attribute__((flatten)) void work_baseline(Worker& w, Items& items, const std::function<bool()>* poll) {
    work<f32x4, f32x4, 8>(w, items, poll);
}

// The entries, best first, each with whether this CPU can run it.
struct Entry {
    const char* name;
    WorkFn work;
    bool (*runs_here)();
};
const Entry kEntries[] = {
#if SPARSE_MLA_CPU_X86
    {"avx512", work_avx512, [] { return __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512vl"); }},
    {"avx2", work_avx2, [] { return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") && __builtin_cpu_supports("f16c"); }},
#endif
    {"baseline", work_baseline, [] { return true; }},
};

// The best entry this CPU runs, at most the one SPARSE_MLA_FP8_CPU_ISA names (read at each call).
const Entry& entry() {
    const char* cap = std::getenv(kIsaVariable);
    bool allowed = cap == nullptr || *cap == '\0';
    for (const Entry& e : kEntries) {
        allowed = allowed || std::strcmp(cap, e.name) == 0;
        if (allowed && e.runs_here()) return e;
    }
    std::string names;
    for (const Entry& e : kEntries) names += std::string(names.empty() ? "" : ", ") + e.name;
    throw std::invalid_argument(std::string(kIsaVariable) + " must be one of " + names + " (or unset), got \"" +
                                cap + "\"");
}

}  // namespace

const char* sparse_mla_cpu_isa() { return entry().name; }

bool sparse_mla_prefill_cpu(const SparseMlaParams& p, int64_t threads, const std::function<bool()>& interrupted) {
    if (p.s_q <= 0 || p.h_q <= 0) return true;
    const WorkFn work_fn = entry().work;
    const float q_scale = p.q_scale_ptr ? *p.q_scale_ptr : p.q_scale;
    const float kv_scale = p.kv_scale_ptr ? *p.kv_scale_ptr : p.kv_scale;
    const float logit_scale = p.sm_scale * q_scale * kv_scale;

    // A token's heads are split (in whole blocks: each group decodes the token's rows again) only as
    // far as needed to give every thread kItemsPerThread items.
    threads = std::max<int64_t>(1, threads);
    const int64_t blocks = round_up(p.h_q, kMaxLanes) / kMaxLanes;
    const int64_t wanted = std::clamp<int64_t>((kItemsPerThread * threads + p.s_q - 1) / p.s_q, 1, blocks);
    const int64_t group_blocks = (blocks + wanted - 1) / wanted;
    Items items{p, std::min(p.h_q, group_blocks * kMaxLanes), (blocks + group_blocks - 1) / group_blocks};
    threads = std::min(threads, p.s_q * items.groups);

    // Scratch is allocated here, so that a failed allocation throws to the caller before any write.
    std::vector<Worker> workers;
    workers.reserve(size_t(threads));
    for (int64_t k = 0; k < threads; ++k) workers.emplace_back(p, logit_scale, kv_scale, items.group_heads);

    std::vector<std::thread> pool;
    pool.reserve(size_t(threads));
    for (int64_t k = 1; k < threads; ++k) {
        try {
            pool.emplace_back(work_fn, std::ref(workers[size_t(k)]), std::ref(items), nullptr);
        } catch (const std::system_error&) {
            break;  // no more threads to be had: those running and this one share the items
        }
    }
    work_fn(workers[0], items, &interrupted);
    for (std::thread& th : pool) th.join();
    return !items.stop.load();
}
