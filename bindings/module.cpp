// sparse_mla_fp8._C: DLPack arrays in, SparseMlaParams out, then the CPU path or a GPU launch.
#include <nanobind/nanobind.h>
#include <nanobind/ndarray.h>
#include <nanobind/stl/optional.h>
#include <nanobind/stl/string.h>

#include "arrays.h"
#include "cpu/prefill_cpu.h"
#if SPARSE_MLA_WITH_CUDA
#include "gpu_launch.h"
#endif

namespace {

void prefill(InArray q, InArray kv, InArray indices, double sm_scale, nb::object q_scale, nb::object kv_scale,
             std::optional<InArray> attn_sink, std::optional<InArray> topk_length, OutArray out, OutArray max_logits,
             OutArray lse, uintptr_t stream, const std::string& fatbin, const std::string& kernel) {
    PrefillArgs args{q, kv, indices, q_scale, kv_scale, attn_sink, topk_length, out, max_logits, lse, sm_scale};
    Device device;
    const SparseMlaParams p = make_params(args, &device);
    if (p.s_q == 0) return;
    if (device.type == nb::device::cpu::value) {
        nb::gil_scoped_release unlocked;
        sparse_mla_prefill_cpu(p);
        return;
    }
#if SPARSE_MLA_WITH_CUDA
    if (fatbin.empty()) throw nb::value_error("no compiled kernel was named for this CUDA call");
    launch_prefill(p, device.id, stream, fatbin, kernel);
#else
    (void)stream, (void)kernel;
    throw nb::value_error("sparse_mla_fp8 was built without CUDA (no nvcc at build time): only CPU arrays are accepted");
#endif
}

nb::list devices() {
    nb::list result;
#if SPARSE_MLA_WITH_CUDA
    for (const CudaDeviceInfo& d : cuda_devices()) {
        nb::dict entry;
        entry["index"] = d.index;
        entry["name"] = d.name;
        entry["major"] = d.major;
        entry["minor"] = d.minor;
        entry["sm_count"] = d.sm_count;
        result.append(entry);
    }
#endif
    return result;
}

}  // namespace

NB_MODULE(_C, m) {
    m.attr("HAS_CUDA") = bool(SPARSE_MLA_WITH_CUDA);
    m.def("prefill", &prefill, nb::arg("q"), nb::arg("kv"), nb::arg("indices"), nb::arg("sm_scale"),
          nb::arg("q_scale"), nb::arg("kv_scale"), nb::arg("attn_sink").none(), nb::arg("topk_length").none(),
          nb::arg("out"), nb::arg("max_logits"), nb::arg("lse"), nb::arg("stream"), nb::arg("fatbin"),
          nb::arg("kernel"),
          "Checks the arrays and runs the prefill on their device; see sparse_mla_fp8.prefill.");
    m.def("cuda_devices", &devices, "The CUDA devices as dicts; raises RuntimeError without a usable driver.");
}
