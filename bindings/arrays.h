// DLPack arrays to SparseMlaParams: every check that keeps the kernels inside their buffers.
#pragma once
#include <nanobind/nanobind.h>
#include <nanobind/ndarray.h>

#include <optional>

#include "params.h"

namespace nb = nanobind;

using InArray = nb::ndarray<nb::ro>;
using OutArray = nb::ndarray<>;

struct Device {
    int type;  // nb::device::cpu::value or nb::device::cuda::value
    int id;
};

struct PrefillArgs {
    InArray q, kv, indices;
    nb::object q_scale, kv_scale;  // a Python float or a 1-element float32 array
    std::optional<InArray> attn_sink, topk_length;
    OutArray out, max_logits, lse;
    double sm_scale;
};

// Raises TypeError/ValueError (nanobind turns std exceptions into them) naming the argument.
SparseMlaParams make_params(const PrefillArgs& a, Device* device);
