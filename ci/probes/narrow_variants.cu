// Timing variants of the narrow kernel (not shipped): CTAs per SM and the e4m3 -> fp16 conversion of
// Q K^T's and P.V's operands. Built and run by narrow_variants.py on the GPU machine.
#include "sm90/narrow/prefill_kernel.cuh"

#define NARROW_VARIANT(NAME, D, MT, QK, PV, C)                                                                  \
    extern "C" __global__ void __launch_bounds__(sparse_mla::sm90::narrow::Shape<MT>::kThreads, C)            \
        narrow_##NAME##_d##D(const uint8_t* q, const uint8_t* kv, const int32_t* indices, const float* sink,    \
                             const int32_t* topk_length, uint16_t* out, float* max_logits, float* lse,          \
                             int64_t s_q, int64_t s_kv, int64_t h_q, int64_t topk, float sm_scale) {            \
        SparseMlaParams p{};                                                                                    \
        p.q = q, p.kv = kv, p.indices = indices, p.attn_sink = sink, p.topk_length = topk_length;             \
        p.out = out, p.max_logits = max_logits, p.lse = lse;                                                   \
        p.s_q = s_q, p.s_kv = s_kv, p.h_q = h_q, p.topk = topk, p.d_qk = D, p.d_v = 512;                       \
        p.q_stride_s = h_q * D, p.q_stride_h = D, p.kv_stride_s = D, p.indices_stride_s = topk;               \
        p.attn_sink_stride = 1, p.topk_length_stride = 1, p.out_stride_s = h_q * 512, p.out_stride_h = 512;   \
        p.max_logits_stride_s = h_q, p.max_logits_stride_h = 1, p.lse_stride_s = h_q, p.lse_stride_h = 1;     \
        p.sm_scale = sm_scale, p.q_scale = 1.f, p.kv_scale = 1.f;                                              \
        p.rows_16b_aligned = true, p.out_rows_16b_aligned = true;                                              \
        sparse_mla::sm90::narrow::prefill<D, MT, sparse_mla::sm90::narrow::QK, sparse_mla::sm90::narrow::PV, C>(p); \
    }
#define NARROW_VARIANTS(D)                                              \
    NARROW_VARIANT(c1_cvt_cvt, D, 1, CvtConvert, CvtConvert, 1)         \
    NARROW_VARIANT(c2_cvt_cvt, D, 1, CvtConvert, CvtConvert, 2)         \
    NARROW_VARIANT(c2_cvt_shift, D, 1, CvtConvert, ShiftConvert, 2)     \
    NARROW_VARIANT(c2_shift_shift, D, 1, ShiftConvert, ShiftConvert, 2) \
    NARROW_VARIANT(c1_shift_shift, D, 1, ShiftConvert, ShiftConvert, 1) \
    NARROW_VARIANT(c2_raw_raw, D, 1, RawConvert, RawConvert, 2)
NARROW_VARIANTS(512)
NARROW_VARIANTS(576)
