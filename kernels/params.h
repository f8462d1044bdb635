// The call as the host hands it to a kernel (GPU and CPU), checked (bindings/arrays.cpp): a plain struct
// passed by value. Which GPU kernel runs it is the registry's choice (kernels/registry.h).
// Strides are in elements. Every pointer is on the device that runs the kernel.
#pragma once
#include <stdint.h>

struct SparseMlaParams {
    const uint8_t* q;            // [s_q, h_q, d_qk] float8 e4m3fn bytes, last dim contiguous
    const uint8_t* kv;           // [s_kv, 1, d_qk] float8 e4m3fn bytes, last dim contiguous
    const int32_t* indices;      // [s_q, 1, topk], last dim contiguous
    const float* q_scale_ptr;    // 1 element, or null: then q_scale is used
    const float* kv_scale_ptr;   // 1 element, or null: then kv_scale is used
    const float* attn_sink;      // [h_q] or null
    const int32_t* topk_length;  // [s_q] or null; values are clamped to [0, topk]
    uint16_t* out;               // [s_q, h_q, d_v] bf16 bits, last dim contiguous
    float* max_logits;           // [s_q, h_q]
    float* lse;                  // [s_q, h_q]

    int64_t s_q, s_kv, h_q, topk, d_qk, d_v;
    int64_t q_stride_s, q_stride_h;
    int64_t kv_stride_s;
    int64_t indices_stride_s;
    int64_t attn_sink_stride, topk_length_stride;
    int64_t out_stride_s, out_stride_h;
    int64_t max_logits_stride_s, max_logits_stride_h;
    int64_t lse_stride_s, lse_stride_h;

    float sm_scale;
    float q_scale, kv_scale;
    // q, kv pointers and row strides all multiples of 16 bytes: rows are copied 16 bytes at a time.
    // Otherwise the kernel falls back to byte copies (any stride is accepted, only slower).
    bool rows_16b_aligned;
    // out pointer and row strides multiples of 16 bytes: O is stored 16 bytes at a time (else 4).
    bool out_rows_16b_aligned;

    // Where the registry's kernel claims its items (KernelSpec::claims_items) and the call has more
    // items than CTAs: a counter, zero at the launch, from which each CTA past its first item claims
    // the next (the host's, stream-ordered). Null: CTA c takes items c, c + gridDim.x, ...
    unsigned long long* item_counter;
};
