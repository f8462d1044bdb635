// Loads the per-head-dim fatbins lazily (first GPU call, not import) and launches the SM90 kernel.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "params.h"

struct CudaDeviceInfo {
    int index, major, minor, sm_count;
    std::string name;
};

// Throws std::runtime_error with the CUDA runtime's message (e.g. no driver).
std::vector<CudaDeviceInfo> cuda_devices();

void launch_prefill(const SparseMlaParams& p, int device, uintptr_t stream, const std::string& fatbin,
                    const std::string& kernel);
