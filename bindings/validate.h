// The one place that checks a prefill call against the contract and words its refusals. It sees the
// call as plain data (no nanobind, no XLA), so that every front end feeds the same checks: the DLPack
// one (arrays.h) and the XLA FFI handler (buffers), at run time with pointers or at trace time on
// shapes alone (null data: the checks of pointers, overlap and alignment then wait for the run).
#pragma once
#include <cstdint>
#include <optional>
#include <stdexcept>
#include <string>
#include <string_view>

#include "params.h"
#include "precision.h"
#include "sm90/config.h"

namespace sparse_mla {

// DLPack's numbering (dlpack.h: DLDeviceType, DLDataTypeCode), so that a DLTensor maps field by field.
enum DeviceType : int32_t { kDeviceCpu = 1, kDeviceCuda = 2 };
enum DTypeCode : uint8_t { kInt = 0, kUInt = 1, kFloat = 2, kBfloat = 4, kBool = 6, kFloat8E4M3FN = 10, kFloat8E5M2 = 12 };

// The head dims CMake compiled (SPARSE_MLA_HEAD_DIMS), the same list as the capability table's.
inline constexpr int64_t kHeadDims[] = {SPARSE_MLA_HEAD_DIMS};
inline constexpr int64_t kDv = sm90::kDv;

struct DType {
    uint8_t code;
    uint8_t bits;
};

struct Device {
    int32_t type;  // DeviceType
    int32_t id;
};

// One array as DLPack describes it (lanes 1). shape and strides point at ndim entries the caller keeps
// alive for the call; strides are in elements, null for a row-major contiguous array (XLA's buffers).
struct ArrayView {
    const void* data = nullptr;  // null: shapes only
    DType dtype{};
    int32_t ndim = 0;
    const int64_t* shape = nullptr;
    const int64_t* strides = nullptr;
    Device device{kDeviceCpu, 0};
    bool readonly = false;
};

// q_scale / kv_scale: a number, or a 1-element float32 array on the arrays' device read by the kernel.
struct ScaleArg {
    float value = 1.0f;
    std::optional<ArrayView> array;  // when given, value is unused
};

// The precision keyword as it came: absent (the default), or a value whose name is `name` (empty for a
// value that is not a string) and which the error shows as `shown` (Python's repr; empty: name quoted).
struct PrecisionArg {
    bool given = false;
    std::string_view name;
    std::string shown;
};

struct PrefillCall {
    ArrayView q, kv, indices;
    ScaleArg q_scale, kv_scale;
    std::optional<ArrayView> attn_sink, topk_length;
    // Absent outputs are the caller's to allocate after the check, with the shapes and dtypes the
    // contract gives (out [s_q, h_q, d_v] bf16, max_logits and lse [s_q, h_q] float32).
    std::optional<ArrayView> out, max_logits, lse;
    double sm_scale = 0.0;
    int64_t d_v = 512;
    PrecisionArg precision;
};

struct CheckedCall {
    SparseMlaParams params;  // pointers null where a view had no data, or an output was absent
    Device device;           // of the arrays (of q when nothing else has one)
    Precision precision;
};

// The contract's TypeError (a wrong dtype, a read-only output); every other refusal is a plain
// std::invalid_argument, the contract's ValueError (nanobind maps it so; arrays.h maps this one).
class ArgumentTypeError : public std::invalid_argument {
public:
    using std::invalid_argument::invalid_argument;
};

// Every check of the contract's "What bad input gets", in one pass; throws the first refusal, naming
// the argument, what was expected and what came. Nothing is read through the pointers.
CheckedCall check_call(const PrefillCall& call);

// The head dims alone, with the contract's fixed texts (the init-time gate, check_config, uses it).
void check_dims(int64_t d_qk, int64_t d_v);

// The precision alone: exact unless given; "exact" / "fast", else the contract's text.
Precision check_precision(const PrecisionArg& precision);

}  // namespace sparse_mla
