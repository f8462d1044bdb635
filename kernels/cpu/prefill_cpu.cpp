#include "prefill_cpu.h"

#include <algorithm>
#include <array>
#include <cmath>
#include <cstring>
#include <limits>
#include <system_error>
#include <thread>
#include <vector>

namespace {

// Valid KV rows decoded at a time: a chunk (2 x 64 rows x 576 floats) stays in L2 while every head
// of the token consumes it; an online softmax joins the chunks, so memory does not grow with topk.
constexpr int64_t kChunk = 64;
// Heads that share each load of a K or V element.
constexpr int kHeadBlock = 4;
// Output columns accumulated at a time in a local block (d_v is padded to a multiple of it).
constexpr int64_t kColumns = 64;

constexpr float kInf = std::numeric_limits<float>::infinity();

// acc[b][i] += w[b] * x[i] for every head b < NB and i < W: one pass over x updates the NB rows
// together, written out per row so that the compiler vectorises over i.
template <int NB, int64_t W>
inline void add_outer(float (&acc)[NB][W], const float (&w)[NB], const float* x) {
    static_assert(NB >= 1 && NB <= 4, "rows are written out up to 4");
    for (int64_t i = 0; i < W; ++i) {
        const float xi = x[i];
        acc[0][i] += w[0] * xi;
        if constexpr (NB > 1) acc[1][i] += w[1] * xi;
        if constexpr (NB > 2) acc[2][i] += w[2] * xi;
        if constexpr (NB > 3) acc[3][i] += w[3] * xi;
    }
}

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
        t[b] = (b & 0x80) ? -mag : mag;
    }
    return t;
}

const std::array<float, 256>& e4m3fn_table() {
    static const std::array<float, 256> table = make_e4m3fn_table();
    return table;
}

uint16_t to_bf16_bits(float f) {
    uint32_t u;
    std::memcpy(&u, &f, sizeof u);
    if ((u & 0x7fffffffu) > 0x7f800000u) return uint16_t((u >> 16) | 0x40);  // keep NaN a (quiet) NaN
    u += 0x7fffu + ((u >> 16) & 1);                                          // round to nearest even
    return uint16_t(u >> 16);
}

int64_t round_up(int64_t x, int64_t m) { return (x + m - 1) / m * m; }

// Unlike std::max, lets a NaN logit poison the row max, as a float64 reference would.
float nan_max(float m, float x) { return (x > m || x != x) ? x : m; }

// Computes a contiguous range of (token, head) pairs. Every pair is finished by one worker, in an
// order that depends only on the inputs, so the output does not depend on how the range was cut.
//
// The inner loops all run over a compile-time count of independent elements held in local arrays,
// never over a reduction, so compilers vectorise them at -O2 without reassociating or checking for
// aliasing; every fp32 sum keeps the order written here.
class Worker {
public:
    Worker(const SparseMlaParams& p, float logit_scale, float kv_scale, int64_t max_heads)
        : p_(p),
          table_(e4m3fn_table().data()),
          logit_scale_(logit_scale),
          kv_scale_(kv_scale),
          vpad_(round_up(p.d_v, kColumns)),
          q_(size_t(max_heads * p.d_qk)),
          kt_(size_t(p.d_qk * kChunk), 0.0f),
          v_(size_t(kChunk * vpad_), 0.0f),  // columns past d_v stay 0 and are never written out
          acc_(size_t(max_heads * vpad_)),
          m_(size_t(max_heads)),
          l_(size_t(max_heads)),
          s_(size_t(kHeadBlock * kChunk)) {}

    void run(int64_t begin, int64_t end) {
        while (begin < end) {
            const int64_t t = begin / p_.h_q, h0 = begin % p_.h_q;
            const int64_t h1 = std::min(p_.h_q, h0 + (end - begin));
            token(t, h0, h1);
            begin += h1 - h0;
        }
    }

private:
    void token(int64_t t, int64_t h0, int64_t h1) {
        const int64_t nh = h1 - h0;
        for (int64_t h = 0; h < nh; ++h) {
            const uint8_t* src = p_.q + t * p_.q_stride_s + (h0 + h) * p_.q_stride_h;
            for (int64_t x = 0; x < p_.d_qk; ++x) q_[h * p_.d_qk + x] = table_[src[x]];
            m_[h] = -kInf;
            l_[h] = 0.0f;
        }
        std::fill(acc_.begin(), acc_.begin() + nh * vpad_, 0.0f);

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
                const uint8_t* src = p_.kv + j * p_.kv_stride_s;
                for (int64_t x = 0; x < p_.d_qk; ++x) kt_[x * kChunk + n] = table_[src[x]];
                for (int64_t x = 0; x < p_.d_v; ++x) v_[n * vpad_ + x] = table_[src[x]];
                ++n;
            }
            if (n == 0) break;
            valid += n;
            for (int64_t h = 0; h < nh; h += kHeadBlock) {
                switch (std::min<int64_t>(kHeadBlock, nh - h)) {
                    case 4: head_block<4>(h, n); break;
                    case 3: head_block<3>(h, n); break;
                    case 2: head_block<2>(h, n); break;
                    default: head_block<1>(h, n); break;
                }
            }
        }
        finish(t, h0, nh, valid);
    }

    // Folds the n rows of the chunk into the running softmax of NB heads from local head h on.
    template <int NB>
    void head_block(int64_t h, int64_t n) {
        const float* q[NB];
        float* acc[NB];
        for (int b = 0; b < NB; ++b) {
            q[b] = &q_[(h + b) * p_.d_qk];
            acc[b] = &acc_[(h + b) * vpad_];
        }
        float* s = s_.data();

        // Logits: K is stored transposed, so the inner loop runs over rows. Rows n.. of the chunk hold
        // stale values from an earlier chunk; their columns are independent and dropped.
        {
            float dot[NB][kChunk] = {};
            for (int64_t x = 0; x < p_.d_qk; ++x) {
                const float* kt = &kt_[x * kChunk];
                float qx[NB];
                for (int b = 0; b < NB; ++b) qx[b] = q[b][x];
                add_outer(dot, qx, kt);
            }
            for (int b = 0; b < NB; ++b)
                for (int64_t c = 0; c < n; ++c) s[b * kChunk + c] = logit_scale_ * dot[b][c];
        }

        float alpha[NB];
        for (int b = 0; b < NB; ++b) {
            float* sb = s + b * kChunk;
            float m_new = m_[h + b];
            for (int64_t c = 0; c < n; ++c) m_new = nan_max(m_new, sb[c]);
            // An all -inf row (only with absurd scales) must not turn exp(-inf - -inf) into NaN.
            const float shift = m_new == -kInf ? 0.0f : m_new;
            alpha[b] = std::exp(m_[h + b] - shift);
            float sum = 0.0f;
            for (int64_t c = 0; c < n; ++c) {
                sb[c] = std::exp(sb[c] - shift);
                sum += sb[c];
            }
            l_[h + b] = l_[h + b] * alpha[b] + sum;
            m_[h + b] = m_new;
        }

        // acc = alpha * acc + sum_c p_c V_c, one block of columns at a time.
        for (int64_t x = 0; x < vpad_; x += kColumns) {
            float a[NB][kColumns];
            for (int b = 0; b < NB; ++b)
                for (int64_t l = 0; l < kColumns; ++l) a[b][l] = acc[b][x + l] * alpha[b];
            for (int64_t c = 0; c < n; ++c) {
                const float* v = &v_[c * vpad_ + x];
                float pc[NB];
                for (int b = 0; b < NB; ++b) pc[b] = s[b * kChunk + c];
                add_outer(a, pc, v);
            }
            for (int b = 0; b < NB; ++b) std::copy(a[b], a[b] + kColumns, acc[b] + x);
        }
    }

    void finish(int64_t t, int64_t h0, int64_t nh, int64_t valid) {
        for (int64_t hl = 0; hl < nh; ++hl) {
            const int64_t h = h0 + hl;
            uint16_t* out = p_.out + t * p_.out_stride_s + h * p_.out_stride_h;
            float& max_logit = p_.max_logits[t * p_.max_logits_stride_s + h * p_.max_logits_stride_h];
            float& lse = p_.lse[t * p_.lse_stride_s + h * p_.lse_stride_h];
            if (valid == 0) {
                std::fill(out, out + p_.d_v, uint16_t(0));
                max_logit = -kInf;
                lse = kInf;
                continue;
            }
            const float m = m_[hl], l = l_[hl];
            // The sink joins the denominator in the same max-shifted domain: -inf adds 0, +inf zeroes out.
            const float sink = p_.attn_sink ? std::exp(p_.attn_sink[h * p_.attn_sink_stride] - m) : 0.0f;
            const float f = kv_scale_ / (l + sink);
            const float* acc = &acc_[hl * vpad_];
            for (int64_t x = 0; x < p_.d_v; ++x) out[x] = to_bf16_bits(acc[x] * f);
            max_logit = m;
            lse = m + std::log(l);
        }
    }

    const SparseMlaParams& p_;
    const float* table_;
    const float logit_scale_, kv_scale_;
    const int64_t vpad_;
    std::vector<float> q_;    // [heads, d_qk] decoded q rows of the current token
    std::vector<float> kt_;   // [d_qk, kChunk] decoded valid kv rows of the chunk, transposed
    std::vector<float> v_;    // [kChunk, vpad] the same rows' first d_v columns
    std::vector<float> acc_;  // [heads, vpad] unnormalised sum of p * V (without kv_scale)
    std::vector<float> m_;    // running max logit per head
    std::vector<float> l_;    // running sum of exp(s - m) per head
    std::vector<float> s_;    // [kHeadBlock, kChunk] logits, then their exponentials
};

}  // namespace

void sparse_mla_prefill_cpu(const SparseMlaParams& p) {
    if (p.s_q <= 0 || p.h_q <= 0) return;
    const float q_scale = p.q_scale_ptr ? *p.q_scale_ptr : p.q_scale;
    const float kv_scale = p.kv_scale_ptr ? *p.kv_scale_ptr : p.kv_scale;
    const float logit_scale = p.sm_scale * q_scale * kv_scale;

    const int64_t items = p.s_q * p.h_q;
    const int64_t n_threads =
        std::min<int64_t>(items, std::max<int64_t>(1, std::thread::hardware_concurrency()));
    auto bound = [&](int64_t k) { return items / n_threads * k + std::min(k, items % n_threads); };

    // Scratch is allocated here, so that a failed allocation throws to the caller before any write.
    std::vector<Worker> workers;
    workers.reserve(size_t(n_threads));
    for (int64_t k = 0; k < n_threads; ++k)
        workers.emplace_back(p, logit_scale, kv_scale, std::min(p.h_q, bound(k + 1) - bound(k)));

    // Reserved up front, so that nothing can throw while a thread is running.
    std::vector<std::thread> threads;
    threads.reserve(size_t(n_threads));
    std::vector<int64_t> inline_ranges;
    inline_ranges.reserve(size_t(n_threads));
    inline_ranges.push_back(0);
    for (int64_t k = 1; k < n_threads; ++k) {
        try {
            threads.emplace_back([&workers, &bound, k] { workers[k].run(bound(k), bound(k + 1)); });
        } catch (const std::system_error&) {
            inline_ranges.push_back(k);  // no thread to be had: this one does the work itself
        }
    }
    for (int64_t k : inline_ranges) workers[k].run(bound(k), bound(k + 1));
    for (std::thread& th : threads) th.join();
}
