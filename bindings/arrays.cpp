#include "arrays.h"

#include <nanobind/stl/string.h>

#include <string>
#include <string_view>

namespace {

using sparse_mla::ArgumentTypeError;
using sparse_mla::ArrayView;
using sparse_mla::DType;
using sparse_mla::ScaleArg;

constexpr DType kNoDType{255, 0};  // a dtype no check accepts: lanes > 1, or a name we do not know

[[noreturn]] void not_an_array(const char* name, nb::handle a) {
    throw ArgumentTypeError(std::string(name) + " must be an array (a DLPack exporter), got " +
                            nb::cast<std::string>(nb::type_name(a.type())));
}

[[noreturn]] void not_a_scale(const char* name, nb::handle s) {
    throw ArgumentTypeError(std::string(name) + " must be a float or a 1-element float32 array, got " +
                            nb::cast<std::string>(nb::type_name(s.type())));
}

bool is_number(nb::handle x) { return PyFloat_Check(x.ptr()) || PyLong_Check(x.ptr()); }

// NumPy's, JAX's and torch's names of a dtype (torch's with its "torch." prefix).
DType dtype_named(std::string_view name) {
    if (name.substr(0, 6) == "torch.") name.remove_prefix(6);
    if (name == "float8_e4m3fn") return {sparse_mla::kFloat8E4M3FN, 8};
    if (name == "float8_e5m2") return {sparse_mla::kFloat8E5M2, 8};
    if (name == "bool") return {sparse_mla::kBool, 8};
    for (auto [prefix, code] : {std::pair{std::string_view("uint"), sparse_mla::kUInt},
                                {std::string_view("int"), sparse_mla::kInt},
                                {std::string_view("float"), sparse_mla::kFloat},
                                {std::string_view("bfloat"), sparse_mla::kBfloat}}) {
        if (name.substr(0, prefix.size()) != prefix) continue;
        const std::string_view bits = name.substr(prefix.size());
        for (int b : {8, 16, 32, 64})
            if (bits == std::to_string(b)) return {static_cast<uint8_t>(code), static_cast<uint8_t>(b)};
    }
    return kNoDType;
}

}  // namespace

ArrayView DLPackArrays::view(const nb::ndarray<>& a, bool readonly) {
    held_[count_++] = a;
    const auto t = a.dtype();
    ArrayView v;
    v.data = a.data();
    v.dtype = t.lanes == 1 ? DType{t.code, t.bits} : kNoDType;
    v.ndim = static_cast<int32_t>(a.ndim());
    v.shape = a.shape_ptr();
    v.strides = a.stride_ptr();
    v.device = {a.device_type(), a.device_id()};
    v.readonly = readonly;
    return v;
}

ArrayView DLPackArrays::input(nb::handle a, const char* name) {
    nb::ndarray<nb::ro> array;
    if (!nb::try_cast(a, array)) not_an_array(name, a);
    return view(nb::ndarray<>(array), true);
}

std::optional<ArrayView> DLPackArrays::optional_input(nb::handle a, const char* name) {
    if (a.is_none()) return std::nullopt;
    return input(a, name);
}

std::optional<ArrayView> DLPackArrays::output(nb::handle a, const char* name) {
    if (a.is_none()) return std::nullopt;
    nb::ndarray<> writable;
    if (nb::try_cast(a, writable)) return view(writable, false);
    return input(a, name);  // DLPack imports it only read-only (or not at all: then a TypeError)
}

ScaleArg DLPackArrays::scale(nb::handle s, const char* name) {
    if (is_number(s)) return {static_cast<float>(nb::cast<double>(s)), std::nullopt};
    nb::ndarray<nb::ro> array;
    if (!nb::try_cast(s, array)) not_a_scale(name, s);
    return {0.0f, view(nb::ndarray<>(array), true)};
}

ArrayView AbstractArrays::input(nb::handle a, const char* name) {
    if (!nb::hasattr(a, "shape") || !nb::hasattr(a, "dtype")) not_an_array(name, a);
    const nb::object shape_seq = a.attr("shape");
    PyObject* shape_tuple = PySequence_Tuple(shape_seq.ptr());
    if (!shape_tuple) throw nb::python_error();
    const nb::tuple shape = nb::steal<nb::tuple>(shape_tuple);
    if (shape.size() > kMaxDims)
        throw std::invalid_argument(std::string(name) + " must have at most " + std::to_string(kMaxDims) +
                                    " dimensions, got " + std::to_string(shape.size()));
    int64_t* dims = shapes_[count_++];
    for (size_t i = 0; i < shape.size(); ++i) dims[i] = nb::cast<int64_t>(shape[i]);
    ArrayView v;
    const nb::object dtype = a.attr("dtype");
    PyObject* dtype_text = PyObject_Str(dtype.ptr());  // str(): NumPy's, JAX's and torch's dtypes all name themselves
    if (!dtype_text) throw nb::python_error();
    v.dtype = dtype_named(nb::cast<std::string>(nb::steal(dtype_text)));
    v.ndim = static_cast<int32_t>(shape.size());
    v.shape = dims;
    return v;
}

std::optional<ArrayView> AbstractArrays::optional_input(nb::handle a, const char* name) {
    if (a.is_none()) return std::nullopt;
    return input(a, name);
}

ScaleArg AbstractArrays::scale(nb::handle s, const char* name) {
    if (is_number(s)) return {static_cast<float>(nb::cast<double>(s)), std::nullopt};
    if (!nb::hasattr(s, "shape")) not_a_scale(name, s);
    return {0.0f, input(s, name)};
}

sparse_mla::PrecisionArg precision_arg(nb::handle precision) {
    sparse_mla::PrecisionArg arg;
    if (precision.is_none()) return arg;
    arg.given = true;
    if (nb::isinstance<nb::str>(precision)) {
        Py_ssize_t size = 0;  // with its length: a NUL inside must not cut "exact\0..." down to "exact"
        const char* text = PyUnicode_AsUTF8AndSize(precision.ptr(), &size);
        if (!text) throw nb::python_error();
        arg.name = std::string_view(text, static_cast<size_t>(size));
    }
    arg.shown = nb::cast<std::string>(nb::repr(precision));
    return arg;
}

void register_argument_errors() {
    nb::register_exception_translator([](const std::exception_ptr& p, void*) {
        try {
            std::rethrow_exception(p);
        } catch (const ArgumentTypeError& e) {
            PyErr_SetString(PyExc_TypeError, e.what());
        }
    });
}
