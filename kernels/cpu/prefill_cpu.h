// The CPU path of the sparse MLA prefill: the contract's operation on host memory.
#pragma once
#include "../params.h"

// Every pointer in p is a host pointer. Uses all cores; the result is bitwise identical whatever the
// thread count. Expects d_v <= d_qk (V is the head of the latent row; the binding checks the dims).
// Throws std::bad_alloc before writing anything if its scratch buffers cannot be allocated.
void sparse_mla_prefill_cpu(const SparseMlaParams& p);
