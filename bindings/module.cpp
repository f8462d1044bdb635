// sparse_mla_fp8._C: DLPack arrays in, the call checked (validate.h), then the CPU path or a GPU launch.
#include <nanobind/nanobind.h>
#include <nanobind/ndarray.h>
#include <nanobind/stl/optional.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/vector.h>

#include <algorithm>
#include <thread>

#include "arrays.h"
#include "cpu/prefill_cpu.h"
#include "registry.h"
#if SPARSE_MLA_WITH_CUDA
#include "gpu_launch.h"
#endif
#if SPARSE_MLA_WITH_XLA_FFI
#include "xla_ffi.h"
#endif

namespace {

// prefill()'s arguments as the plain call that check_call reads; Arrays: DLPackArrays or AbstractArrays.
template <class Arrays>
sparse_mla::PrefillCall describe(Arrays& arrays, nb::handle q, nb::handle kv, nb::handle indices, double sm_scale,
                                 nb::handle q_scale, nb::handle kv_scale, nb::handle attn_sink, nb::handle topk_length,
                                 nb::handle out, nb::handle max_logits, nb::handle lse, int64_t d_v,
                                 nb::handle precision) {
    sparse_mla::PrefillCall c;
    c.q = arrays.input(q, "q");
    c.kv = arrays.input(kv, "kv");
    c.indices = arrays.input(indices, "indices");
    c.q_scale = arrays.scale(q_scale, "q_scale");
    c.kv_scale = arrays.scale(kv_scale, "kv_scale");
    c.attn_sink = arrays.optional_input(attn_sink, "attn_sink");
    c.topk_length = arrays.optional_input(topk_length, "topk_length");
    c.out = arrays.output(out, "out");
    c.max_logits = arrays.output(max_logits, "max_logits");
    c.lse = arrays.output(lse, "lse");
    c.sm_scale = sm_scale;
    c.d_v = d_v;
    c.precision = precision_arg(precision);
    return c;
}

void prefill(nb::handle q, nb::handle kv, nb::handle indices, double sm_scale, nb::handle q_scale, nb::handle kv_scale,
             nb::handle attn_sink, nb::handle topk_length, nb::handle out, nb::handle max_logits, nb::handle lse,
             uintptr_t stream, std::optional<std::string> force_kernel, int64_t d_v,
             nb::handle precision, int64_t cpu_threads) {
    if (out.is_none() || max_logits.is_none() || lse.is_none())
        throw nb::type_error("out, max_logits and lse must be arrays: _C.prefill writes into them");
    if (force_kernel && !sparse_mla::kernel_named(*force_kernel))
        throw nb::value_error(("no kernel named " + *force_kernel + " in the registry").c_str());
    DLPackArrays arrays;
    const sparse_mla::CheckedCall checked = sparse_mla::check_call(
        describe(arrays, q, kv, indices, sm_scale, q_scale, kv_scale, attn_sink, topk_length, out, max_logits, lse, d_v,
                 precision));
    const SparseMlaParams& p = checked.params;
    if (p.s_q == 0) return;
    if (checked.device.type == sparse_mla::kDeviceCpu) {
        if (force_kernel) throw nb::value_error("force_kernel names a GPU kernel, but the arrays are on the CPU");
        if (cpu_threads <= 0) cpu_threads = std::max(1u, std::thread::hardware_concurrency());
        bool finished;
        {
            nb::gil_scoped_release unlocked;
            // exact whatever the precision; Ctrl-C is seen between work items, its KeyboardInterrupt
            // raised here
            finished = sparse_mla_prefill_cpu(p, cpu_threads, [] {
                nb::gil_scoped_acquire locked;
                return PyErr_CheckSignals() != 0;
            });
        }
        if (!finished) throw nb::python_error();
        return;
    }
#if SPARSE_MLA_WITH_CUDA
    launch_prefill(p, checked.device.id, stream, checked.precision, force_kernel ? force_kernel->c_str() : nullptr);
#else
    (void)stream;
    throw nb::value_error("sparse_mla_fp8 was built without CUDA (no nvcc at build time): only CPU arrays are accepted");
#endif
}

void check(nb::handle q, nb::handle kv, nb::handle indices, double sm_scale, nb::handle q_scale, nb::handle kv_scale,
           nb::handle attn_sink, nb::handle topk_length, nb::handle out, nb::handle max_logits, nb::handle lse,
           int64_t d_v, nb::handle precision) {
    AbstractArrays arrays;
    sparse_mla::check_call(describe(arrays, q, kv, indices, sm_scale, q_scale, kv_scale, attn_sink, topk_length, out,
                                    max_logits, lse, d_v, precision));
}

nb::list kernel_names() {
    nb::list names;
    for (const sparse_mla::KernelSpec& k : sparse_mla::kKernels) names.append(k.name);
    return names;
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
    register_argument_errors();
    m.attr("HAS_CUDA") = bool(SPARSE_MLA_WITH_CUDA);
    m.attr("D_V") = sparse_mla::kDv;
    m.def("prefill", &prefill, nb::arg("q"), nb::arg("kv"), nb::arg("indices"), nb::arg("sm_scale"),
          nb::arg("q_scale"), nb::arg("kv_scale"), nb::arg("attn_sink").none(), nb::arg("topk_length").none(),
          nb::arg("out").none(), nb::arg("max_logits").none(), nb::arg("lse").none(), nb::arg("stream"),
          nb::arg("force_kernel").none() = nb::none(), nb::kw_only(), nb::arg("d_v") = sparse_mla::kDv,
          nb::arg("precision").none() = nb::none(), nb::arg("cpu_threads") = 0,
          "Checks the call (every refusal of the contract) and runs the prefill on the arrays' device; see "
          "sparse_mla_fp8.prefill. On a GPU the registry chooses the kernel from the checked call "
          "(force_kernel: run the kernel of that name instead, for the tests). On the CPU it runs on "
          "cpu_threads threads (0: one per core).");
    m.def("check", &check, nb::arg("q"), nb::arg("kv"), nb::arg("indices"), nb::arg("sm_scale"), nb::arg("q_scale"),
          nb::arg("kv_scale"), nb::arg("attn_sink").none(), nb::arg("topk_length").none(), nb::arg("out").none(),
          nb::arg("max_logits").none(), nb::arg("lse").none(), nb::kw_only(), nb::arg("d_v") = sparse_mla::kDv,
          nb::arg("precision").none() = nb::none(),
          "prefill's checks on shapes and dtypes alone: the arrays are anything with .shape and .dtype (JAX's and "
          "torch's tracers included), the outputs may be None; the checks of pointers, devices and overlap wait "
          "for prefill.");
    m.def("check_dims", &sparse_mla::check_dims, nb::arg("d_qk"), nb::arg("d_v"),
          "Raises prefill's ValueError for head dims that this build has no kernel for.");
    m.def("head_dims", [] { return std::vector<int64_t>(std::begin(sparse_mla::kHeadDims), std::end(sparse_mla::kHeadDims)); },
          "The head dims (d_qk) this module was compiled for.");
    m.def(
        "kernel_for",
        [](int64_t h_q, int64_t topk, nb::handle precision) {
            return sparse_mla::kernel_for(h_q, topk, sparse_mla::check_precision(precision_arg(precision))).name;
        },
        nb::arg("h_q"), nb::arg("topk"), nb::arg("precision").none() = nb::none(),
        "The name of the GPU kernel that runs a call with h_q heads and topk slots at this precision "
        "(None: prefill's default).");
    m.def("kernel_names", &kernel_names, "The registry's GPU kernels, in the order the launch tries them.");
#if SPARSE_MLA_WITH_CUDA
    m.def("set_kernel_dir", &set_kernel_dir, nb::arg("path"),
          "The folder of the fatbins (" SPARSE_MLA_FATBIN_PREFIX "<d_qk>.fatbin); set once, before the first GPU call.");
#endif
    m.def("cpu_isa", &sparse_mla_cpu_isa,
          "The CPU path's instruction set here (\"avx512\", \"avx2\" or \"baseline\"), capped by SPARSE_MLA_FP8_CPU_ISA.");
    m.def("cuda_devices", &devices, "The CUDA devices as dicts; raises RuntimeError without a usable driver.");
#if SPARSE_MLA_WITH_XLA_FFI
    m.def(
        "xla_ffi_targets",
        [] {
            nb::dict targets;
            for (auto [platform, handler] : xla_ffi_handlers()) targets[platform] = nb::capsule(handler);
            return targets;
        },
        "The prefill's XLA FFI handlers as capsules, by platform, for jax.ffi.register_ffi_target.");
    m.attr("XLA_OPERANDS") = nb::make_tuple(
        nb::make_tuple("q_scale", int64_t(kXlaQScale)), nb::make_tuple("kv_scale", int64_t(kXlaKvScale)),
        nb::make_tuple("attn_sink", int64_t(kXlaAttnSink)), nb::make_tuple("topk_length", int64_t(kXlaTopkLength)));
#endif
}
