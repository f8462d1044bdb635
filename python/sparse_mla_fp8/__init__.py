"""FP8 sparse MLA prefill for DeepSeek-V3.2-style token-sparse attention, compiled ahead of time.

Importing this module loads the native module but neither touches CUDA nor imports torch, CuPy or
JAX; they are used only when the caller's arrays belong to them.
"""

import importlib
from importlib.metadata import PackageNotFoundError, version

try:
    # import_module, not "from . import _C": its error names the missing module plainly
    importlib.import_module(f"{__name__}._C")
except ImportError as e:
    raise ImportError(
        f"sparse_mla_fp8's native module _C is missing or failed to load ({e}); "
        "build and install the package (pip install .)") from e

from ._api import prefill, sparse_mla_q8kv8_prefill_fwd
from ._capabilities import capabilities, check_config, supports
from ._frameworks import bf16_to_float32

try:
    __version__ = version("sparse-mla-fp8")
except PackageNotFoundError:  # imported from a source tree that was built in place, not installed
    __version__ = "0+unknown"

__all__ = ["prefill", "sparse_mla_q8kv8_prefill_fwd", "check_config", "supports", "capabilities",
           "bf16_to_float32", "__version__"]
