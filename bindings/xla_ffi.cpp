// The prefill as XLA FFI custom calls, for JAX (python/sparse_mla_fp8/_jax.py): XLA's buffers are
// described to check_call (validate.h) like any other call's arrays, then run on the CPU path, or
// launched on XLA's CUDA stream. Runs on XLA's threads, without the GIL: nothing here touches Python.
#include "xla_ffi.h"

#include <xla/ffi/api/ffi.h>

#include <algorithm>
#include <exception>
#include <optional>
#include <string_view>
#include <utility>

#include "cpu/prefill_cpu.h"
#include "validate.h"
#if SPARSE_MLA_WITH_CUDA
#include <cuda_runtime.h>

#include "gpu_launch.h"
#endif

namespace ffi = xla::ffi;

namespace {

using sparse_mla::ArrayView;
using sparse_mla::DType;

DType dtype_of(ffi::DataType t) {
    const uint8_t bits = static_cast<uint8_t>(8 * ffi::ByteWidth(t));
    switch (t) {
        case ffi::DataType::PRED: return {sparse_mla::kBool, 8};
        case ffi::DataType::S8:
        case ffi::DataType::S16:
        case ffi::DataType::S32:
        case ffi::DataType::S64: return {sparse_mla::kInt, bits};
        case ffi::DataType::U8:
        case ffi::DataType::U16:
        case ffi::DataType::U32:
        case ffi::DataType::U64: return {sparse_mla::kUInt, bits};
        case ffi::DataType::F16:
        case ffi::DataType::F32:
        case ffi::DataType::F64: return {sparse_mla::kFloat, bits};
        case ffi::DataType::BF16: return {sparse_mla::kBfloat, 16};
        case ffi::DataType::F8E4M3FN: return {sparse_mla::kFloat8E4M3FN, 8};
        case ffi::DataType::F8E5M2: return {sparse_mla::kFloat8E5M2, 8};
        default: return {255, bits};  // a code no check accepts; the error shows it
    }
}

// XLA's buffers are dense and row-major: the views carry no strides.
template <class Buffer>
ArrayView view_of(const Buffer& b, sparse_mla::Device device) {
    ArrayView v;
    v.data = b.untyped_data();
    v.dtype = dtype_of(b.element_type());
    const auto dims = b.dimensions();
    v.ndim = static_cast<int32_t>(dims.size());
    v.shape = dims.begin();
    v.device = device;
    return v;
}

ffi::Error invalid(const std::exception& e) { return ffi::Error(ffi::ErrorCode::kInvalidArgument, e.what()); }

// The call as check_call reads it. The optional operands follow q, kv and indices in the order of
// XlaOperand's bits, each present where `operands` has its bit (the Python side sets them).
sparse_mla::PrefillCall describe(sparse_mla::Device device, ffi::AnyBuffer q, ffi::AnyBuffer kv,
                                 ffi::AnyBuffer indices, const ffi::RemainingArgs& rest, double sm_scale,
                                 float q_scale, float kv_scale, int64_t operands, std::string_view precision,
                                 ffi::Result<ffi::AnyBuffer>& out, ffi::Result<ffi::AnyBuffer>& max_logits,
                                 ffi::Result<ffi::AnyBuffer>& lse) {
    sparse_mla::PrefillCall c;
    c.q = view_of(q, device);
    c.kv = view_of(kv, device);
    c.indices = view_of(indices, device);
    size_t next = 0;
    auto operand = [&](int64_t bit) -> std::optional<ArrayView> {
        if (!(operands & bit)) return std::nullopt;
        ffi::ErrorOr<ffi::AnyBuffer> b = rest.get<ffi::AnyBuffer>(next++);
        if (b.has_error()) throw std::invalid_argument("sparse_mla_fp8: fewer operands than the call names");
        return view_of(*b, device);
    };
    c.q_scale = {q_scale, operand(kXlaQScale)};
    c.kv_scale = {kv_scale, operand(kXlaKvScale)};
    c.attn_sink = operand(kXlaAttnSink);
    c.topk_length = operand(kXlaTopkLength);
    if (next != rest.size()) throw std::invalid_argument("sparse_mla_fp8: more operands than the call names");
    c.out = view_of(*out, device);
    c.max_logits = view_of(*max_logits, device);
    c.lse = view_of(*lse, device);
    c.sm_scale = sm_scale;
    c.d_v = sparse_mla::kDv;
    // an empty name: the keyword was not given (the trace-time check refused every other value)
    c.precision.given = !precision.empty();
    c.precision.name = precision;
    return c;
}

// The operands, attributes and results of both handlers (one custom call: one signature), after
// their context.
template <class Binding>
auto bind_call(Binding binding) {
    return std::move(binding)
        .template Arg<ffi::AnyBuffer>()  // q
        .template Arg<ffi::AnyBuffer>()  // kv
        .template Arg<ffi::AnyBuffer>()  // indices
        .RemainingArgs()                 // the optional operands, as "operands" says
        .template Attr<double>("sm_scale")
        .template Attr<float>("q_scale")
        .template Attr<float>("kv_scale")
        .template Attr<int64_t>("operands")
        .template Attr<std::string_view>("precision")
        .template Attr<int64_t>("cpu_threads")
        .template Ret<ffi::AnyBuffer>()  // out
        .template Ret<ffi::AnyBuffer>()  // max_logits
        .template Ret<ffi::AnyBuffer>();  // lse
}

// cpu_threads: the caller's thread setting, read at trace time. XLA's threads cannot see Ctrl-C (that
// needs the GIL): the call runs to its end.
ffi::Error prefill_cpu(ffi::AnyBuffer q, ffi::AnyBuffer kv, ffi::AnyBuffer indices, ffi::RemainingArgs rest,
                       double sm_scale, float q_scale, float kv_scale, int64_t operands, std::string_view precision,
                       int64_t cpu_threads, ffi::Result<ffi::AnyBuffer> out, ffi::Result<ffi::AnyBuffer> max_logits,
                       ffi::Result<ffi::AnyBuffer> lse) {
    try {
        const sparse_mla::CheckedCall checked =
            sparse_mla::check_call(describe({sparse_mla::kDeviceCpu, 0}, q, kv, indices, rest, sm_scale, q_scale,
                                            kv_scale, operands, precision, out, max_logits, lse));
        // exact whatever the precision
        if (checked.params.s_q > 0)
            sparse_mla_prefill_cpu(checked.params, std::max<int64_t>(1, cpu_threads), [] { return false; });
    } catch (const std::invalid_argument& e) {
        return invalid(e);
    } catch (const std::exception& e) {
        return ffi::Error::Internal(e.what());
    }
    return ffi::Error::Success();
}

XLA_FFI_DEFINE_HANDLER(prefill_cpu_handler, prefill_cpu, bind_call(ffi::Ffi::Bind()));

#if SPARSE_MLA_WITH_CUDA
ffi::Error prefill_cuda(cudaStream_t stream, int32_t device, ffi::AnyBuffer q, ffi::AnyBuffer kv,
                        ffi::AnyBuffer indices, ffi::RemainingArgs rest, double sm_scale, float q_scale,
                        float kv_scale, int64_t operands, std::string_view precision,
                        int64_t /*cpu_threads: the CPU handler's (one call, one set of attributes)*/,
                        ffi::Result<ffi::AnyBuffer> out, ffi::Result<ffi::AnyBuffer> max_logits,
                        ffi::Result<ffi::AnyBuffer> lse) {
    try {
        const sparse_mla::CheckedCall checked =
            sparse_mla::check_call(describe({sparse_mla::kDeviceCuda, device}, q, kv, indices, rest, sm_scale,
                                            q_scale, kv_scale, operands, precision, out, max_logits, lse));
        if (checked.params.s_q > 0)
            launch_prefill(checked.params, device, reinterpret_cast<uintptr_t>(stream), checked.precision, nullptr);
    } catch (const std::invalid_argument& e) {
        return invalid(e);
    } catch (const std::exception& e) {
        return ffi::Error::Internal(e.what());
    }
    return ffi::Error::Success();
}

XLA_FFI_DEFINE_HANDLER(prefill_cuda_handler, prefill_cuda,
                       bind_call(ffi::Ffi::Bind().Ctx<ffi::PlatformStream<cudaStream_t>>().Ctx<ffi::DeviceOrdinal>()));
#endif

}  // namespace

std::vector<std::pair<const char*, void*>> xla_ffi_handlers() {
    std::vector<std::pair<const char*, void*>> handlers{{"cpu", reinterpret_cast<void*>(prefill_cpu_handler)}};
#if SPARSE_MLA_WITH_CUDA
    handlers.emplace_back("CUDA", reinterpret_cast<void*>(prefill_cuda_handler));
#endif
    return handlers;
}
