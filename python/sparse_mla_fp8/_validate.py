"""What prefill() checks in Python: that each argument is an array, a number or None where it may be.
Every other check (dtypes, shapes, head dims, devices, strides, overlap, precision) is the native
module's (bindings/validate.h), which words the contract's errors once for every front end.
"""

from numbers import Real

from ._frameworks import framework_of


def not_an_array(name, a):
    return TypeError(f"{name} must be an array (torch, NumPy, CuPy, JAX or any DLPack exporter), "
                     f"got {type(a).__name__}")


def require_arrays(named):
    """TypeError for the first (name, value) whose value is neither None nor an array."""
    for name, a in named:
        if a is not None and framework_of(a) is None:
            raise not_an_array(name, a)


def number(name, x):
    if type(x) is float:
        return x
    if isinstance(x, Real) and framework_of(x) is None:
        return float(x)
    raise TypeError(f"{name} must be a float, got {type(x).__name__}")


def scale(name, x):
    """A float, or the array itself (a 1-element float32 array on q's device, read by the kernel)."""
    if type(x) is float or framework_of(x) is not None:
        return x
    if isinstance(x, Real):
        return float(x)
    raise TypeError(f"{name} must be a float or a 1-element float32 array, got {type(x).__name__}")
