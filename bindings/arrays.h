// Python objects to the plain call of validate.h: arrays through DLPack (nanobind imports them; the
// views point into what it keeps alive), or abstract arrays with a shape and a dtype only (what JAX and
// torch trace with), for a check before any array exists.
#pragma once
#include <nanobind/nanobind.h>
#include <nanobind/ndarray.h>

#include <optional>

#include "validate.h"

namespace nb = nanobind;

// The call's DLPack arrays, held for as long as the views of its PrefillCall are in use.
class DLPackArrays {
public:
    // An input; TypeError naming it for what DLPack cannot import.
    sparse_mla::ArrayView input(nb::handle a, const char* name);
    std::optional<sparse_mla::ArrayView> optional_input(nb::handle a, const char* name);
    // An output, imported writable; a read-only one comes back marked so, for check_call to refuse.
    std::optional<sparse_mla::ArrayView> output(nb::handle a, const char* name);
    sparse_mla::ScaleArg scale(nb::handle s, const char* name);

private:
    sparse_mla::ArrayView view(const nb::ndarray<>& a, bool readonly);
    static constexpr int kMaxArrays = 10;  // q, kv, indices, 2 scales, attn_sink, topk_length, 3 outputs
    nb::ndarray<> held_[kMaxArrays];
    int count_ = 0;
};

// The same for abstract arrays (anything with .shape and .dtype), as views with null data: a check
// before any array exists. The shapes are held for as long as the views are in use.
class AbstractArrays {
public:
    sparse_mla::ArrayView input(nb::handle a, const char* name);
    std::optional<sparse_mla::ArrayView> optional_input(nb::handle a, const char* name);
    std::optional<sparse_mla::ArrayView> output(nb::handle a, const char* name) { return optional_input(a, name); }
    sparse_mla::ScaleArg scale(nb::handle s, const char* name);

private:
    static constexpr int kMaxArrays = 10;
    static constexpr int kMaxDims = 8;  // more than any argument takes (check_call refuses them)
    int64_t shapes_[kMaxArrays][kMaxDims];
    int count_ = 0;
};

// The precision keyword as check_call reads it (None: the default).
sparse_mla::PrecisionArg precision_arg(nb::handle precision);

// Maps the TypeErrors of check_call (sparse_mla::ArgumentTypeError) to Python's TypeError.
void register_argument_errors();
