// The CPU path of the sparse MLA prefill: the contract's operation on host memory.
#pragma once
#include <functional>

#include "../params.h"

// Every pointer in p is a host pointer. Runs on `threads` threads (the caller's one among them); the
// result is bitwise identical whatever the thread count. Calls `interrupted` on the calling thread
// between work items (about every 20 ms); once it returns true, stops after the items in progress and
// returns false, with the outputs partly written. Expects d_v <= d_qk (V is the head of the latent
// row; the binding checks the dims). Throws std::bad_alloc before writing anything if its scratch
// buffers cannot be allocated, and std::invalid_argument if SPARSE_MLA_FP8_CPU_ISA names no entry.
bool sparse_mla_prefill_cpu(const SparseMlaParams& p, int64_t threads, const std::function<bool()>& interrupted);

// The instruction set the CPU path runs on here: "avx512", "avx2" or "baseline" (x86-64 without AVX;
// the only entry on other CPUs), the best the CPU has, capped by the environment variable
// SPARSE_MLA_FP8_CPU_ISA when it is set to one of these names.
const char* sparse_mla_cpu_isa();
