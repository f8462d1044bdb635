#include "gpu_launch.h"

#include <cuda_runtime.h>
#include <dlfcn.h>

#include <map>
#include <mutex>
#include <stdexcept>
#include <utility>

namespace {

void check(cudaError_t err, const char* what) {
    if (err == cudaSuccess) return;
    // The runtime also keeps a failed call's error as the thread's last error, which the caller's next
    // launch check (torch's cudaGetLastError after each of its kernels) would report as its own.
    cudaGetLastError();
    throw std::runtime_error(std::string("sparse_mla_fp8: ") + what + ": " + cudaGetErrorString(err));
}

// Guards kernel_dir and the caches: Python's threads and XLA's (the JAX primitive launches without the
// GIL) share them.
std::mutex cache_mutex;

std::string kernel_dir;  // set once (set_kernel_dir)

// Lets this thread load and configure kernels while a CUDA graph capture is under way (a capture may
// hold the process's first launch): none of it is stream work, but a capture in the global mode refuses
// the calls it deems unsafe, from any thread. Restores the thread's mode when it ends.
class RelaxedCapture {
public:
    RelaxedCapture() { cudaThreadExchangeStreamCaptureMode(&mode_); }
    ~RelaxedCapture() { cudaThreadExchangeStreamCaptureMode(&mode_); }

private:
    cudaStreamCaptureMode mode_ = cudaStreamCaptureModeRelaxed;
};

// The registry's kernel k for d_qk, from its d_qk's fatbin; the names are built only on a cache miss.
// Called with cache_mutex held.
cudaKernel_t get_kernel(int64_t d_qk, const sparse_mla::KernelSpec& k) {
    static std::map<std::pair<int64_t, const sparse_mla::KernelSpec*>, cudaKernel_t> kernels;
    static std::map<int64_t, cudaLibrary_t> libraries;
    auto found = kernels.find({d_qk, &k});
    if (found != kernels.end()) return found->second;
    const RelaxedCapture relaxed;
    if (kernel_dir.empty()) throw std::logic_error("sparse_mla_fp8: set_kernel_dir() was not called before a launch");
    const std::string fatbin = kernel_dir + "/" SPARSE_MLA_FATBIN_PREFIX + std::to_string(d_qk) + ".fatbin";
    auto lib = libraries.find(d_qk);
    if (lib == libraries.end()) {
        cudaLibrary_t l;
        check(cudaLibraryLoadFromFile(&l, fatbin.c_str(), nullptr, nullptr, 0, nullptr, nullptr, 0),
              ("loading " + fatbin).c_str());
        lib = libraries.emplace(d_qk, l).first;
    }
    const std::string name = k.entry(d_qk);
    cudaKernel_t kernel;
    check(cudaLibraryGetKernel(&kernel, lib->second, name.c_str()), ("finding " + name + " in " + fatbin).c_str());
    return kernels.emplace(std::make_pair(d_qk, &k), kernel).first->second;
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

// The runtime reports a missing libcuda as cudaErrorInsufficientDriver ("CUDA driver version is
// insufficient"), which sends the user to upgrade a driver that is not there.
bool driver_loads() {
    void* driver = dlopen("libcuda.so.1", RTLD_LAZY | RTLD_LOCAL);
    if (driver != nullptr) dlclose(driver);
    return driver != nullptr;
}

}  // namespace

std::vector<CudaDeviceInfo> cuda_devices() {
    int count = 0;
    const cudaError_t err = cudaGetDeviceCount(&count);
    if (err == cudaErrorInsufficientDriver && !driver_loads())
        throw std::runtime_error("sparse_mla_fp8: no CUDA driver found (libcuda.so.1 cannot be loaded)");
    check(err, "cudaGetDeviceCount");
    std::vector<CudaDeviceInfo> out;
    for (int i = 0; i < count; ++i) {
        cudaDeviceProp prop;
        check(cudaGetDeviceProperties(&prop, i), "cudaGetDeviceProperties");
        out.push_back({i, prop.major, prop.minor, prop.multiProcessorCount, prop.name});
    }
    return out;
}

void set_kernel_dir(const std::string& dir) {
    std::lock_guard<std::mutex> lock(cache_mutex);
    // the loaded fatbins are cached by d_qk: they must all come from one folder
    if (!kernel_dir.empty() && dir != kernel_dir)
        throw std::logic_error("sparse_mla_fp8: the kernel folder is " + kernel_dir + " already, not " + dir);
    kernel_dir = dir;
}

void launch_prefill(const SparseMlaParams& p, int device, uintptr_t stream, sparse_mla::Precision precision,
                    const char* force_kernel) {
    const sparse_mla::KernelSpec* k = force_kernel ? sparse_mla::kernel_named(force_kernel)
                                                   : &sparse_mla::kernel_for(p.h_q, p.topk, precision);
    if (k == nullptr) throw std::invalid_argument(std::string("sparse_mla_fp8: no kernel named ") + force_kernel);
    DeviceScope scope(device);
    const int smem = k->smem_bytes(static_cast<int>(p.d_qk));
    cudaKernel_t kernel;
    int sm_count;
    {
        std::lock_guard<std::mutex> lock(cache_mutex);
        kernel = get_kernel(p.d_qk, *k);
        // Once per (kernel, device): the kernel's shared memory size, and the device's SM count for a
        // persistent grid (ctas_per_sm CTAs per SM, each with the shared memory that leaves it, taking
        // work items in turn). Kept only when both calls succeed.
        static std::map<std::pair<cudaKernel_t, int>, int> sm_counts;
        auto configured = sm_counts.find({kernel, device});
        if (configured == sm_counts.end()) {
            const RelaxedCapture relaxed;
            check(cudaKernelSetAttributeForDevice(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, smem, device),
                  "setting the kernel's shared memory size");
            int n = 0;
            check(cudaDeviceGetAttribute(&n, cudaDevAttrMultiProcessorCount, device), "cudaDeviceGetAttribute");
            configured = sm_counts.emplace(std::make_pair(kernel, device), n).first;
        }
        sm_count = configured->second;
    }
    const int64_t ctas = static_cast<int64_t>(sm_count) * k->ctas_per_sm;
    const int64_t items = p.s_q * k->head_blocks(p.h_q);
    const dim3 grid(static_cast<unsigned>(items < ctas ? items : ctas));
    SparseMlaParams params = p;
    params.item_counter = nullptr;
    const auto s = reinterpret_cast<cudaStream_t>(stream);
    // The counter the CTAs claim items from, where the kernel claims and there are more items than
    // CTAs: the call's own, zeroed, freed, all on the stream (no host sync; a graph capture records
    // them as nodes).
    cudaError_t err = cudaSuccess;
    if (k->claims_items && items > ctas) {
        err = cudaMallocAsync(reinterpret_cast<void**>(&params.item_counter), sizeof(unsigned long long), s);
        if (err == cudaSuccess) err = cudaMemsetAsync(params.item_counter, 0, sizeof(unsigned long long), s);
        else params.item_counter = nullptr;
    }
    void* args[] = {&params};
    if (err == cudaSuccess)
        err = cudaLaunchKernel(reinterpret_cast<const void*>(kernel), grid, dim3(k->threads), args, smem, s);
    if (params.item_counter != nullptr) cudaFreeAsync(params.item_counter, s);
    check(err, "launching the prefill kernel");
}
