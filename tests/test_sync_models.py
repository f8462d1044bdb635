"""The kernels' synchronization models (ci/models/) stay clean: every random schedule of the model ends,
with every buffer read while it holds its tile and written only after its readers are done."""
import importlib.util
import pathlib
import sys

import pytest

MODELS_DIR = pathlib.Path(__file__).parent.parent / "ci" / "models"
MODELS = sorted(MODELS_DIR.glob("*_sync.py"))
sys.path.insert(0, str(MODELS_DIR))  # the models import sync_model
import sync_model  # noqa: E402


@pytest.mark.parametrize("path", MODELS, ids=[p.stem for p in MODELS])
def test_sync_model(path):
    spec = importlib.util.spec_from_file_location(path.stem, path)
    model = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(model)
    assert sync_model.check(model.run, 500)  # (it prints the first bad schedules)
