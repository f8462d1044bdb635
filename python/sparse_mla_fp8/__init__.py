"""FP8 sparse MLA prefill for DeepSeek-V3.2-style token-sparse attention, compiled ahead of time.

Importing this module loads the native module but neither touches CUDA nor imports torch, CuPy or
JAX; they are used only when the caller's arrays belong to them.
"""

import importlib

try:
    # import_module, not "from . import _C": its error names the missing module plainly
    importlib.import_module(f"{__name__}._C")
except ImportError as e:
    raise ImportError(
        f"sparse_mla_fp8's native module _C is missing or failed to load ({e}); "
        "build and install the package (pip install .)") from e

from ._api import prefill, sparse_mla_q8kv8_prefill_fwd
from ._capabilities import capabilities, check_config, manifest, supports
from ._frameworks import bf16_to_float32

# The build's own record, right for a plain `cmake --install` too (which leaves no pip metadata).
__version__ = manifest()["version"]

__all__ = ["prefill", "sparse_mla_q8kv8_prefill_fwd", "check_config", "supports", "capabilities",
           "bf16_to_float32", "__version__"]
