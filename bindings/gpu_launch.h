// Launches the registry's SM90 kernels, from fatbins loaded lazily (first GPU call, not import).
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "params.h"
#include "registry.h"

struct CudaDeviceInfo {
    int index, major, minor, sm_count;
    std::string name;
};

// Throws std::runtime_error with the CUDA runtime's message (e.g. no driver).
std::vector<CudaDeviceInfo> cuda_devices();

// The folder that holds the fatbins, one per d_qk (set once by the Python layer, before a launch).
void set_kernel_dir(const std::string& dir);

// Runs the call p (checked: kernels/params.h) with the kernel that the registry chooses for it, or
// with `force_kernel` (a registry name) when that is not null, from the fatbin of p.d_qk.
void launch_prefill(const SparseMlaParams& p, int device, uintptr_t stream, sparse_mla::Precision precision,
                    const char* force_kernel);
