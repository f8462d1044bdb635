#include "gpu_launch.h"

#include <cuda_runtime.h>

#include <map>
#include <stdexcept>
#include <utility>

#include "sm90/config.h"
#include "sm90/dual/config.h"
#include "sm90/split/config.h"
#include "sm90/wide/config.h"

namespace {

void check(cudaError_t err, const char* what) {
    if (err != cudaSuccess)
        throw std::runtime_error(std::string("sparse_mla_fp8: ") + what + ": " + cudaGetErrorString(err));
}

// Called with the GIL held, so the caches need no lock of their own.
cudaKernel_t get_kernel(const std::string& fatbin, const std::string& name) {
    static std::map<std::pair<std::string, std::string>, cudaKernel_t> kernels;
    static std::map<std::string, cudaLibrary_t> libraries;
    auto found = kernels.find({fatbin, name});
    if (found != kernels.end()) return found->second;
    auto lib = libraries.find(fatbin);
    if (lib == libraries.end()) {
        cudaLibrary_t l;
        check(cudaLibraryLoadFromFile(&l, fatbin.c_str(), nullptr, nullptr, 0, nullptr, nullptr, 0),
              ("loading " + fatbin).c_str());
        lib = libraries.emplace(fatbin, l).first;
    }
    cudaKernel_t k;
    check(cudaLibraryGetKernel(&k, lib->second, name.c_str()), ("finding " + name + " in " + fatbin).c_str());
    return kernels.emplace(std::make_pair(fatbin, name), k).first->second;
}

// Makes the inputs' device current for the launch and restores the caller's afterwards (or when it
// throws); switches only when they differ, so the common call pays for one cudaGetDevice.
class DeviceScope {
public:
    explicit DeviceScope(int device) {
        check(cudaGetDevice(&previous_), "cudaGetDevice");
        if (previous_ != device) {
            check(cudaSetDevice(device), "cudaSetDevice");
            switched_ = true;
        }
    }
    ~DeviceScope() {
        if (switched_) cudaSetDevice(previous_);
    }

private:
    int previous_ = 0;
    bool switched_ = false;
};

}  // namespace

std::vector<CudaDeviceInfo> cuda_devices() {
    int count = 0;
    check(cudaGetDeviceCount(&count), "cudaGetDeviceCount");
    std::vector<CudaDeviceInfo> out;
    for (int i = 0; i < count; ++i) {
        cudaDeviceProp prop;
        check(cudaGetDeviceProperties(&prop, i), "cudaGetDeviceProperties");
        out.push_back({i, prop.major, prop.minor, prop.multiProcessorCount, prop.name});
    }
    return out;
}

void launch_prefill(const SparseMlaParams& p, int device, uintptr_t stream, const std::string& fatbin,
                    const std::string& kernel_name) {
    namespace cfg = sparse_mla::sm90;
    DeviceScope scope(device);
    // the wide kernel (128 heads per CTA), the split one (64 heads, the slots split between the
    // consumer warpgroups) or the dual one (two CTAs per SM) where it takes the call, else the 64-head one
    struct Choice {
        std::string suffix;
        int smem;
        int64_t head_blocks;
        int threads, ctas_per_sm;
    };
    const int d_qk = static_cast<int>(p.d_qk);
    const Choice choice =
        cfg::wide::takes(p.h_q, p.topk)
            ? Choice{cfg::wide::kKernelSuffix, cfg::wide::smem_bytes(d_qk), cfg::wide::head_blocks(p.h_q), cfg::kThreads, 1}
        : cfg::split::takes(p.h_q, p.topk)
            ? Choice{cfg::split::kKernelSuffix, cfg::split::smem_bytes(d_qk), cfg::split::head_blocks(p.h_q), cfg::kThreads, 1}
        : cfg::dual::takes(p.h_q, p.topk)
            ? Choice{cfg::dual::kKernelSuffix, cfg::dual::smem_bytes(d_qk), cfg::dual::head_blocks(p.h_q),
                     cfg::dual::kThreads, cfg::dual::kCtasPerSm}
            : Choice{"", cfg::smem_bytes(d_qk), cfg::head_blocks(p.h_q), cfg::kThreads, 1};
    cudaKernel_t kernel = get_kernel(fatbin, kernel_name + choice.suffix);
    const int smem = choice.smem;

    // Once per (kernel, device): the kernel's shared memory size, and the device's SM count for a
    // persistent grid (ctas_per_sm CTAs per SM, each with the shared memory that leaves it, taking
    // work items in turn). Kept only when both calls succeed.
    static std::map<std::pair<cudaKernel_t, int>, int> sm_counts;
    auto configured = sm_counts.find({kernel, device});
    if (configured == sm_counts.end()) {
        check(cudaKernelSetAttributeForDevice(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, smem, device),
              "setting the kernel's shared memory size");
        int n = 0;
        check(cudaDeviceGetAttribute(&n, cudaDevAttrMultiProcessorCount, device), "cudaDeviceGetAttribute");
        configured = sm_counts.emplace(std::make_pair(kernel, device), n).first;
    }
    const int64_t ctas = static_cast<int64_t>(configured->second) * choice.ctas_per_sm;
    const int64_t items = p.s_q * choice.head_blocks;
    const dim3 grid(static_cast<unsigned>(items < ctas ? items : ctas));
    SparseMlaParams params = p;
    void* args[] = {&params};
    check(cudaLaunchKernel(reinterpret_cast<const void*>(kernel), grid, dim3(choice.threads), args, smem,
                           reinterpret_cast<cudaStream_t>(stream)),
          "launching the prefill kernel");
}
