// The XLA FFI handlers of the prefill (xla_ffi.cpp), for the module to hand to JAX as capsules. Built only
// where the build environment has jax (its XLA FFI headers); SPARSE_MLA_WITH_XLA_FFI says whether it did.
#pragma once
#include <cstdint>
#include <utility>
#include <vector>

// The bits of the handlers' "operands" attribute: which optional operands follow q, kv and indices,
// in this order.
enum XlaOperand : int64_t { kXlaQScale = 1, kXlaKvScale = 2, kXlaAttnSink = 4, kXlaTopkLength = 8 };

// (platform as jax.ffi.register_ffi_target names it, XLA_FFI_Handler*): "cpu", and "CUDA" in a CUDA build.
std::vector<std::pair<const char*, void*>> xla_ffi_handlers();
