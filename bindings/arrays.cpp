#include "arrays.h"

#include <algorithm>
#include <cstdint>
#include <string>
#include <vector>

#include "sm90/config.h"

namespace {

using nb::dlpack::dtype_code;

std::string dtype_name(nb::dlpack::dtype t) {
    switch (static_cast<dtype_code>(t.code)) {
        case dtype_code::Int: return "int" + std::to_string(t.bits);
        case dtype_code::UInt: return "uint" + std::to_string(t.bits);
        case dtype_code::Float: return "float" + std::to_string(t.bits);
        case dtype_code::Bfloat: return "bfloat" + std::to_string(t.bits);
        case dtype_code::Bool: return "bool";
        case dtype_code::Float8_E4M3FN: return "float8_e4m3fn";
        case dtype_code::Float8_E5M2: return "float8_e5m2";
        default: return "dtype(code=" + std::to_string(t.code) + ", bits=" + std::to_string(t.bits) + ")";
    }
}

bool is(nb::dlpack::dtype t, dtype_code code, int bits) {
    return t.code == static_cast<uint8_t>(code) && t.bits == bits && t.lanes == 1;
}

std::string shape_str(const std::vector<int64_t>& s) {
    std::string r = "(";
    for (size_t i = 0; i < s.size(); ++i) r += (i ? ", " : "") + std::to_string(s[i]);
    return r + (s.size() == 1 ? ",)" : ")");
}

template <class A>
std::vector<int64_t> shape_of(const A& a) {
    std::vector<int64_t> s(a.ndim());
    for (size_t i = 0; i < a.ndim(); ++i) s[i] = a.shape(i);
    return s;
}

template <class A>
void require_shape(const A& a, const char* name, const std::vector<int64_t>& want) {
    if (shape_of(a) != want)
        throw nb::value_error((std::string(name) + " must have shape " + shape_str(want) + ", got " +
                               shape_str(shape_of(a))).c_str());
}

template <class A>
void require_contiguous_last(const A& a, const char* name) {
    const size_t last = a.ndim() - 1;
    if (a.shape(last) > 1 && a.stride(last) != 1)
        throw nb::value_error((std::string(name) + " must have a contiguous last dimension (stride 1), got stride " +
                               std::to_string(a.stride(last))).c_str());
}

template <class A>
void require_dtype(const A& a, const char* name, bool ok, const char* expected) {
    if (!ok) throw nb::type_error((std::string(name) + " must be " + expected + ", got " + dtype_name(a.dtype())).c_str());
}

// Byte range an array can touch; arrays whose ranges meet are treated as aliasing.
struct Span {
    uintptr_t lo, hi;
    const char* name;
};

template <class A>
Span span_of(const A& a, const char* name) {
    intptr_t lo = 0, hi = 0;
    const intptr_t item = static_cast<intptr_t>(a.itemsize());
    for (size_t i = 0; i < a.ndim(); ++i) {
        if (a.shape(i) == 0) return {0, 0, name};
        const intptr_t reach = (a.shape(i) - 1) * a.stride(i) * item;
        (reach < 0 ? lo : hi) += reach;
    }
    const uintptr_t base = reinterpret_cast<uintptr_t>(a.data());
    return {base + lo, base + hi + item, name};
}

class DeviceCheck {
public:
    template <class A>
    void add(const A& a, const char* name) {
        const Device d{a.device_type(), a.device_id()};
        if (d.type != nb::device::cpu::value && d.type != nb::device::cuda::value)
            throw nb::value_error((std::string(name) + " must be on the CPU or a CUDA device, got DLPack device type " +
                                   std::to_string(d.type)).c_str());
        if (!first_) {
            first_ = name;
            device_ = d;
        } else if (d.type != device_.type || d.id != device_.id) {
            throw nb::value_error((std::string("all arrays must be on one device: ") + first_ + " is on " +
                                   describe(device_) + ", " + name + " is on " + describe(d)).c_str());
        }
    }
    Device device() const { return device_; }

private:
    static std::string describe(Device d) {
        return d.type == nb::device::cpu::value ? "cpu" : "cuda:" + std::to_string(d.id);
    }
    const char* first_ = nullptr;
    Device device_{};
};

const float* scale_array(const nb::object& scale, const char* name, float* value, DeviceCheck& devices) {
    if (PyFloat_Check(scale.ptr()) || PyLong_Check(scale.ptr())) {
        *value = static_cast<float>(nb::cast<double>(scale));
        return nullptr;
    }
    InArray a;
    if (!nb::try_cast(scale, a))
        throw nb::type_error((std::string(name) + " must be a float or a 1-element float32 array").c_str());
    require_dtype(a, name, is(a.dtype(), dtype_code::Float, 32), "a float or a 1-element float32 array");
    if (a.size() != 1)
        throw nb::value_error((std::string(name) + " must have 1 element, got " + std::to_string(a.size())).c_str());
    devices.add(a, name);
    *value = 0.f;
    return static_cast<const float*>(a.data());
}

}  // namespace

SparseMlaParams make_params(const PrefillArgs& a, Device* device) {
    const char* fp8 = "float8_e4m3fn or uint8 (e4m3fn bytes)";
    auto fp8_ok = [](nb::dlpack::dtype t) { return is(t, dtype_code::Float8_E4M3FN, 8) || is(t, dtype_code::UInt, 8); };

    require_dtype(a.q, "q", fp8_ok(a.q.dtype()), fp8);
    require_dtype(a.kv, "kv", fp8_ok(a.kv.dtype()), fp8);
    require_dtype(a.indices, "indices", is(a.indices.dtype(), dtype_code::Int, 32), "int32");
    const auto od = a.out.dtype();
    require_dtype(a.out, "out", is(od, dtype_code::Bfloat, 16) || is(od, dtype_code::UInt, 16) || is(od, dtype_code::Int, 16),
                  "bfloat16 (or uint16/int16 holding bf16 bits)");
    require_dtype(a.max_logits, "max_logits", is(a.max_logits.dtype(), dtype_code::Float, 32), "float32");
    require_dtype(a.lse, "lse", is(a.lse.dtype(), dtype_code::Float, 32), "float32");

    if (a.q.ndim() != 3) throw nb::value_error(("q must have 3 dimensions [s_q, h_q, d_qk], got shape " + shape_str(shape_of(a.q))).c_str());
    const int64_t s_q = a.q.shape(0), h_q = a.q.shape(1), d_qk = a.q.shape(2);
    if (a.kv.ndim() != 3) throw nb::value_error(("kv must have 3 dimensions [s_kv, 1, d_qk], got shape " + shape_str(shape_of(a.kv))).c_str());
    const int64_t s_kv = a.kv.shape(0);
    require_shape(a.kv, "kv", {s_kv, 1, d_qk});
    if (a.indices.ndim() != 3) throw nb::value_error(("indices must have 3 dimensions [s_q, 1, topk], got shape " + shape_str(shape_of(a.indices))).c_str());
    const int64_t topk = a.indices.shape(2);
    require_shape(a.indices, "indices", {s_q, 1, topk});
    if (h_q < 1) throw nb::value_error("h_q must be >= 1, got 0");
    if (topk < 1) throw nb::value_error("topk must be >= 1, got 0");
    if (d_qk < sparse_mla::sm90::kDv || d_qk % 32 != 0)
        throw nb::value_error(("d_qk must be a multiple of 32 and >= 512, got " + std::to_string(d_qk)).c_str());
    require_shape(a.out, "out", {s_q, h_q, sparse_mla::sm90::kDv});
    require_shape(a.max_logits, "max_logits", {s_q, h_q});
    require_shape(a.lse, "lse", {s_q, h_q});
    for (auto [arr, name] : {std::pair{&a.q, "q"}, {&a.kv, "kv"}, {&a.indices, "indices"}})
        require_contiguous_last(*arr, name);
    require_contiguous_last(a.out, "out");

    DeviceCheck devices;
    devices.add(a.q, "q");
    devices.add(a.kv, "kv");
    devices.add(a.indices, "indices");
    devices.add(a.out, "out");
    devices.add(a.max_logits, "max_logits");
    devices.add(a.lse, "lse");

    SparseMlaParams p{};
    p.q_scale_ptr = scale_array(a.q_scale, "q_scale", &p.q_scale, devices);
    p.kv_scale_ptr = scale_array(a.kv_scale, "kv_scale", &p.kv_scale, devices);

    std::vector<Span> inputs{span_of(a.q, "q"), span_of(a.kv, "kv"), span_of(a.indices, "indices")};
    if (a.attn_sink) {
        const InArray& s = *a.attn_sink;
        require_dtype(s, "attn_sink", is(s.dtype(), dtype_code::Float, 32), "float32");
        require_shape(s, "attn_sink", {h_q});
        devices.add(s, "attn_sink");
        p.attn_sink = static_cast<const float*>(s.data());
        p.attn_sink_stride = s.stride(0);
        inputs.push_back(span_of(s, "attn_sink"));
    }
    if (a.topk_length) {
        const InArray& l = *a.topk_length;
        require_dtype(l, "topk_length", is(l.dtype(), dtype_code::Int, 32), "int32");
        require_shape(l, "topk_length", {s_q});
        devices.add(l, "topk_length");
        p.topk_length = static_cast<const int32_t*>(l.data());
        p.topk_length_stride = l.stride(0);
        inputs.push_back(span_of(l, "topk_length"));
    }
    *device = devices.device();

    const Span outputs[] = {span_of(a.out, "out"), span_of(a.max_logits, "max_logits"), span_of(a.lse, "lse")};
    for (size_t i = 0; i < 3; ++i) {
        auto overlaps = [&](const Span& o) { return outputs[i].lo < o.hi && o.lo < outputs[i].hi; };
        for (size_t j = i + 1; j < 3; ++j)
            if (overlaps(outputs[j]))
                throw nb::value_error((std::string(outputs[i].name) + " and " + outputs[j].name + " must not overlap").c_str());
        for (const Span& in : inputs)
            if (overlaps(in))
                throw nb::value_error((std::string(outputs[i].name) + " must not overlap the input " + in.name).c_str());
    }

    if (device->type == nb::device::cuda::value) {
        const uintptr_t out_addr = reinterpret_cast<uintptr_t>(a.out.data());
        if (out_addr % 4 || a.out.stride(0) % 2 || a.out.stride(1) % 2)
            throw nb::value_error("out must be 4-byte aligned with even strides (the kernel stores bf16 pairs)");
    }

    p.q = static_cast<const uint8_t*>(a.q.data());
    p.kv = static_cast<const uint8_t*>(a.kv.data());
    p.indices = static_cast<const int32_t*>(a.indices.data());
    p.out = static_cast<uint16_t*>(a.out.data());
    p.max_logits = static_cast<float*>(a.max_logits.data());
    p.lse = static_cast<float*>(a.lse.data());
    p.s_q = s_q;
    p.s_kv = s_kv;
    p.h_q = h_q;
    p.topk = topk;
    p.d_qk = d_qk;
    p.d_v = sparse_mla::sm90::kDv;
    p.q_stride_s = a.q.stride(0);
    p.q_stride_h = a.q.stride(1);
    p.kv_stride_s = a.kv.stride(0);
    p.indices_stride_s = a.indices.stride(0);
    p.out_stride_s = a.out.stride(0);
    p.out_stride_h = a.out.stride(1);
    p.max_logits_stride_s = a.max_logits.stride(0);
    p.max_logits_stride_h = a.max_logits.stride(1);
    p.lse_stride_s = a.lse.stride(0);
    p.lse_stride_h = a.lse.stride(1);
    p.sm_scale = static_cast<float>(a.sm_scale);
    const auto aligned = [](int64_t x) { return x % 16 == 0; };
    p.rows_16b_aligned = reinterpret_cast<uintptr_t>(p.q) % 16 == 0 && reinterpret_cast<uintptr_t>(p.kv) % 16 == 0 &&
                         aligned(p.q_stride_s) && aligned(p.q_stride_h) && aligned(p.kv_stride_s);
    p.out_rows_16b_aligned = reinterpret_cast<uintptr_t>(p.out) % 16 == 0 && aligned(2 * p.out_stride_s) &&
                             aligned(2 * p.out_stride_h);
    return p;
}
