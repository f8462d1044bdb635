"""The kernels' synchronization models (ci/models/) stay clean: every random schedule of the model ends,
with every buffer read while it holds its tile and written only after its readers are done."""
import importlib.util
import pathlib
import random
import sys

import pytest

MODELS_DIR = pathlib.Path(__file__).parent.parent / "ci" / "models"
MODELS = sorted(MODELS_DIR.glob("*_sync.py"))


@pytest.mark.parametrize("path", MODELS, ids=[p.stem for p in MODELS])
def test_sync_model(path):
    sys.path.insert(0, str(MODELS_DIR))  # the models import sync_model
    spec = importlib.util.spec_from_file_location(path.stem, path)
    model = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(model)
    for seed in range(500):
        rng = random.Random(seed)
        items = [rng.choice([0, 1, 2, 3, 5]) for _ in range(rng.randint(0, 5))]
        deadlock, errors = model.run(items, seed)
        assert deadlock is None and not errors, (items, seed, deadlock, errors[:3])
