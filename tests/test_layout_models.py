"""The kernels' layout models (ci/models/ other than the synchronization ones) hold: each, run as a
script, checks in Python with the layouts PTX defines that a kernel's fragments or shared-memory
accesses land where the kernel reads them (its asserts fail the test)."""
import pathlib
import runpy
import sys

import pytest

MODELS_DIR = pathlib.Path(__file__).parent.parent / "ci" / "models"
sys.path.insert(0, str(MODELS_DIR))  # a model may import another's layout functions
MODELS = sorted(p for p in MODELS_DIR.glob("*.py") if not p.stem.endswith("_sync") and p.stem != "sync_model")


@pytest.mark.parametrize("path", MODELS, ids=[p.stem for p in MODELS])
def test_layout_model(path):
    runpy.run_path(str(path), run_name="__main__")
