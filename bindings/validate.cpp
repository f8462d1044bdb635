#include "validate.h"

#include <algorithm>
#include <cstdlib>
#include <initializer_list>
#include <utility>
#include <vector>

namespace sparse_mla {
namespace {

constexpr Precision kDefaultPrecision = Precision::exact;
constexpr const char* kOp = "sparse_mla_q8kv8_prefill_fwd";  // the engines match on errors that start with it

[[noreturn]] void refuse(const std::string& message) { throw std::invalid_argument(message); }
[[noreturn]] void refuse_type(const std::string& message) { throw ArgumentTypeError(message); }

std::string dtype_name(DType t) {
    const std::string bits = std::to_string(t.bits);
    switch (t.code) {
        case kInt: return "int" + bits;
        case kUInt: return "uint" + bits;
        case kFloat: return "float" + bits;
        case kBfloat: return "bfloat" + bits;
        case kBool: return "bool";
        case kFloat8E4M3FN: return "float8_e4m3fn";
        case kFloat8E5M2: return "float8_e5m2";
        default: return "dtype(code=" + std::to_string(t.code) + ", bits=" + bits + ")";
    }
}

bool is(DType t, DTypeCode code, int bits) { return t.code == code && t.bits == bits; }
bool is_fp8(DType t) { return is(t, kFloat8E4M3FN, 8) || is(t, kUInt, 8); }
bool is_bf16(DType t) { return is(t, kBfloat, 16) || is(t, kUInt, 16) || is(t, kInt, 16); }
bool is_f32(DType t) { return is(t, kFloat, 32); }
bool is_i32(DType t) { return is(t, kInt, 32); }

constexpr const char* kFp8Text = "float8_e4m3fn or uint8 (e4m3fn bytes)";
constexpr const char* kBf16Text = "bfloat16 (or uint16/int16 holding bf16 bits)";

std::string shape_text(const int64_t* shape, int64_t ndim) {
    std::string r = "(";
    for (int64_t i = 0; i < ndim; ++i) r += (i ? ", " : "") + std::to_string(shape[i]);
    return r + (ndim == 1 ? ",)" : ")");
}

std::string shape_text(const ArrayView& a) { return shape_text(a.shape, a.ndim); }

std::string dims_text() {
    std::vector<int64_t> dims(std::begin(kHeadDims), std::end(kHeadDims));
    std::sort(dims.begin(), dims.end());
    std::string r;
    for (int64_t d : dims) r += (r.empty() ? "" : "/") + std::to_string(d);
    return r;
}

int64_t elements(const ArrayView& a) {
    int64_t n = 1;
    for (int32_t i = 0; i < a.ndim; ++i) n *= a.shape[i];
    return n;
}

int64_t stride(const ArrayView& a, int32_t dim) {
    if (a.strides) return a.strides[dim];
    int64_t s = 1;
    for (int32_t i = dim + 1; i < a.ndim; ++i) s *= a.shape[i];
    return s;
}

void require_dtype(const ArrayView& a, const char* name, bool ok, const char* expected) {
    if (!ok) refuse_type(std::string(name) + " must be " + expected + ", got " + dtype_name(a.dtype));
}

void require_ndim(const ArrayView& a, const char* name, int32_t ndim, const char* dims) {
    if (a.ndim != ndim)
        refuse(std::string(name) + " must have " + std::to_string(ndim) + " dimension" + (ndim > 1 ? "s " : " ") +
               dims + ", got shape " + shape_text(a));
}

void require_shape(const ArrayView& a, const char* name, std::initializer_list<int64_t> want) {
    if (a.ndim == static_cast<int32_t>(want.size()) && std::equal(want.begin(), want.end(), a.shape)) return;
    refuse(std::string(name) + " must have shape " + shape_text(want.begin(), int64_t(want.size())) + ", got " +
           shape_text(a));
}

// An empty array's strides mean nothing (exporters write 0 or anything there).
void require_contiguous_last(const ArrayView& a, const char* name) {
    const int32_t last = a.ndim - 1;
    if (elements(a) > 0 && a.shape[last] > 1 && stride(a, last) != 1)
        refuse(std::string(name) + " must have a contiguous last dimension (stride 1), got stride " +
               std::to_string(stride(a, last)));
}

void require_writable(const ArrayView& a, const char* name) {
    if (a.readonly) refuse_type(std::string(name) + " must be a writable array, got a read-only one");
}

std::string device_text(Device d) {
    if (d.type == kDeviceCpu) return "cpu";
    if (d.type == kDeviceCuda) return "cuda:" + std::to_string(d.id);
    return "DLPack device type " + std::to_string(d.type);
}

class DeviceCheck {
public:
    void add(const ArrayView& a, const char* name) {
        const Device d = a.device;
        if (d.type != kDeviceCpu && d.type != kDeviceCuda)
            refuse(std::string(name) + " must be on the CPU or a CUDA device, got " + device_text(d));
        if (!first_) {
            first_ = name;
            device_ = d;
        } else if (d.type != device_.type || d.id != device_.id) {
            refuse(std::string("all arrays must be on one device: ") + first_ + " is on " + device_text(device_) + ", " +
                   name + " is on " + device_text(d));
        }
    }
    Device device() const { return device_; }

private:
    const char* first_ = nullptr;
    Device device_{kDeviceCpu, 0};
};

// Bytes an array can touch; arrays whose ranges meet are treated as aliasing.
struct Span {
    uintptr_t lo, hi;
    const char* name;
};

Span span_of(const ArrayView& a, const char* name) {
    const intptr_t item = a.dtype.bits / 8;
    intptr_t lo = 0, hi = 0;
    for (int32_t i = 0; i < a.ndim; ++i) {
        if (a.shape[i] == 0) return {0, 0, name};
        const intptr_t reach = (a.shape[i] - 1) * stride(a, i) * item;
        (reach < 0 ? lo : hi) += reach;
    }
    const uintptr_t base = reinterpret_cast<uintptr_t>(a.data);
    return {base + lo, base + hi + item, name};
}

bool overlap(const Span& a, const Span& b) { return a.lo < b.hi && b.lo < a.hi; }

// Whether two elements of `a` may share memory (a broadcast view's stride 0, or strides that interleave):
// its dims of extent > 1, by stride, must each step past all that the smaller ones reach.
bool self_overlapping(const ArrayView& a) {
    if (elements(a) == 0) return false;
    std::vector<std::pair<int64_t, int64_t>> dims;  // (|stride|, extent)
    for (int32_t i = 0; i < a.ndim; ++i)
        if (a.shape[i] > 1) dims.emplace_back(std::abs(stride(a, i)), a.shape[i]);
    std::sort(dims.begin(), dims.end());
    int64_t reach = 1;  // elements, from the first, that the dims so far span
    for (auto [step, extent] : dims) {
        if (step < reach) return true;
        reach += step * (extent - 1);
    }
    return false;
}

const float* scale_of(const ScaleArg& s, const char* name, float* value, DeviceCheck& devices) {
    if (!s.array) {
        *value = s.value;
        return nullptr;
    }
    const ArrayView& a = *s.array;
    require_dtype(a, name, is_f32(a.dtype), "a float or a 1-element float32 array");
    if (elements(a) != 1) refuse(std::string(name) + " must have 1 element, got " + std::to_string(elements(a)));
    devices.add(a, name);
    *value = 0.0f;
    return static_cast<const float*>(a.data);
}

}  // namespace

void check_dims(int64_t d_qk, int64_t d_v) {
    if (std::find(std::begin(kHeadDims), std::end(kHeadDims), d_qk) == std::end(kHeadDims))
        refuse(std::string(kOp) + " supports d_qk=" + dims_text() + ", got " + std::to_string(d_qk));
    if (d_v != kDv) refuse(std::string(kOp) + " requires d_v=" + std::to_string(kDv) + ", got " + std::to_string(d_v));
}

Precision check_precision(const PrecisionArg& precision) {
    if (!precision.given) return kDefaultPrecision;
    if (const auto named = precision_named(precision.name)) return *named;
    const std::string shown = precision.shown.empty() ? "'" + std::string(precision.name) + "'" : precision.shown;
    refuse("precision must be \"exact\" or \"fast\", got " + shown);
}

CheckedCall check_call(const PrefillCall& c) {
    const ArrayView &q = c.q, &kv = c.kv, &indices = c.indices;
    require_dtype(q, "q", is_fp8(q.dtype), kFp8Text);
    require_dtype(kv, "kv", is_fp8(kv.dtype), kFp8Text);
    require_dtype(indices, "indices", is_i32(indices.dtype), "int32");
    if (c.attn_sink) require_dtype(*c.attn_sink, "attn_sink", is_f32(c.attn_sink->dtype), "float32");
    if (c.topk_length) require_dtype(*c.topk_length, "topk_length", is_i32(c.topk_length->dtype), "int32");
    if (c.out) require_dtype(*c.out, "out", is_bf16(c.out->dtype), kBf16Text);
    if (c.max_logits) require_dtype(*c.max_logits, "max_logits", is_f32(c.max_logits->dtype), "float32");
    if (c.lse) require_dtype(*c.lse, "lse", is_f32(c.lse->dtype), "float32");

    require_ndim(q, "q", 3, "[s_q, h_q, d_qk]");
    const int64_t s_q = q.shape[0], h_q = q.shape[1], d_qk = q.shape[2];
    check_dims(d_qk, c.d_v);
    if (h_q < 1) refuse("h_q must be >= 1, got " + std::to_string(h_q));
    require_ndim(kv, "kv", 3, "[s_kv, 1, d_qk]");
    const int64_t s_kv = kv.shape[0];
    require_shape(kv, "kv", {s_kv, 1, d_qk});
    require_ndim(indices, "indices", 3, "[s_q, 1, topk]");
    const int64_t topk = indices.shape[2];
    require_shape(indices, "indices", {s_q, 1, topk});
    if (topk < 1) refuse("topk must be >= 1, got " + std::to_string(topk));
    if (c.attn_sink) require_shape(*c.attn_sink, "attn_sink", {h_q});
    if (c.topk_length) require_shape(*c.topk_length, "topk_length", {s_q});
    if (c.out) require_shape(*c.out, "out", {s_q, h_q, kDv});
    if (c.max_logits) require_shape(*c.max_logits, "max_logits", {s_q, h_q});
    if (c.lse) require_shape(*c.lse, "lse", {s_q, h_q});
    require_contiguous_last(q, "q");
    require_contiguous_last(kv, "kv");
    require_contiguous_last(indices, "indices");
    if (c.out) require_contiguous_last(*c.out, "out");
    for (auto [a, name] : {std::pair{&c.out, "out"}, {&c.max_logits, "max_logits"}, {&c.lse, "lse"}})
        if (*a) require_writable(**a, name);

    DeviceCheck devices;
    devices.add(q, "q");
    devices.add(kv, "kv");
    devices.add(indices, "indices");
    if (c.attn_sink) devices.add(*c.attn_sink, "attn_sink");
    if (c.topk_length) devices.add(*c.topk_length, "topk_length");
    if (c.out) devices.add(*c.out, "out");
    if (c.max_logits) devices.add(*c.max_logits, "max_logits");
    if (c.lse) devices.add(*c.lse, "lse");

    CheckedCall r{};
    SparseMlaParams& p = r.params;
    p.q_scale_ptr = scale_of(c.q_scale, "q_scale", &p.q_scale, devices);
    p.kv_scale_ptr = scale_of(c.kv_scale, "kv_scale", &p.kv_scale, devices);
    r.device = devices.device();
    r.precision = check_precision(c.precision);

    // Every CTA reads the inputs (scales included) while others write the outputs: no output may
    // share a byte with another array. Checked where the pointers are known.
    std::vector<Span> inputs{span_of(q, "q"), span_of(kv, "kv"), span_of(indices, "indices")};
    if (c.attn_sink) inputs.push_back(span_of(*c.attn_sink, "attn_sink"));
    if (c.topk_length) inputs.push_back(span_of(*c.topk_length, "topk_length"));
    if (c.q_scale.array) inputs.push_back(span_of(*c.q_scale.array, "q_scale"));
    if (c.kv_scale.array) inputs.push_back(span_of(*c.kv_scale.array, "kv_scale"));
    std::vector<Span> outputs;
    for (auto [a, name] : {std::pair{&c.out, "out"}, {&c.max_logits, "max_logits"}, {&c.lse, "lse"}})
        if (*a && (*a)->data) {
            // every element is written by one CTA: two that share memory would be written by two
            if (self_overlapping(**a)) refuse(std::string(name) + " must not have elements that overlap, got strides " +
                                              shape_text((*a)->strides, (*a)->ndim));
            outputs.push_back(span_of(**a, name));
        }
    for (size_t i = 0; i < outputs.size(); ++i) {
        for (size_t j = i + 1; j < outputs.size(); ++j)
            if (overlap(outputs[i], outputs[j]))
                refuse(std::string(outputs[i].name) + " and " + outputs[j].name + " must not overlap");
        for (const Span& in : inputs)
            if (overlap(outputs[i], in))
                refuse(std::string(outputs[i].name) + " must not overlap the input " + in.name);
    }
    if (c.out && c.out->data && r.device.type == kDeviceCuda) {
        const uintptr_t out_addr = reinterpret_cast<uintptr_t>(c.out->data);
        if (out_addr % 4 || stride(*c.out, 0) % 2 || stride(*c.out, 1) % 2)
            refuse("out must be 4-byte aligned with even strides (the kernel stores bf16 pairs)");
    }

    p.q = static_cast<const uint8_t*>(q.data);
    p.kv = static_cast<const uint8_t*>(kv.data);
    p.indices = static_cast<const int32_t*>(indices.data);
    if (c.attn_sink) {
        p.attn_sink = static_cast<const float*>(c.attn_sink->data);
        p.attn_sink_stride = stride(*c.attn_sink, 0);
    }
    if (c.topk_length) {
        p.topk_length = static_cast<const int32_t*>(c.topk_length->data);
        p.topk_length_stride = stride(*c.topk_length, 0);
    }
    p.s_q = s_q;
    p.s_kv = s_kv;
    p.h_q = h_q;
    p.topk = topk;
    p.d_qk = d_qk;
    p.d_v = kDv;
    p.q_stride_s = stride(q, 0);
    p.q_stride_h = stride(q, 1);
    p.kv_stride_s = stride(kv, 0);
    p.indices_stride_s = stride(indices, 0);
    if (c.out) {
        p.out = static_cast<uint16_t*>(const_cast<void*>(c.out->data));
        p.out_stride_s = stride(*c.out, 0);
        p.out_stride_h = stride(*c.out, 1);
    }
    if (c.max_logits) {
        p.max_logits = static_cast<float*>(const_cast<void*>(c.max_logits->data));
        p.max_logits_stride_s = stride(*c.max_logits, 0);
        p.max_logits_stride_h = stride(*c.max_logits, 1);
    }
    if (c.lse) {
        p.lse = static_cast<float*>(const_cast<void*>(c.lse->data));
        p.lse_stride_s = stride(*c.lse, 0);
        p.lse_stride_h = stride(*c.lse, 1);
    }
    p.sm_scale = static_cast<float>(c.sm_scale);
    const auto aligned = [](int64_t x) { return x % 16 == 0; };
    p.rows_16b_aligned = reinterpret_cast<uintptr_t>(p.q) % 16 == 0 && reinterpret_cast<uintptr_t>(p.kv) % 16 == 0 &&
                         aligned(p.q_stride_s) && aligned(p.q_stride_h) && aligned(p.kv_stride_s);
    p.out_rows_16b_aligned = reinterpret_cast<uintptr_t>(p.out) % 16 == 0 && aligned(2 * p.out_stride_s) &&
                             aligned(2 * p.out_stride_h);
    return r;
}

}  // namespace sparse_mla
