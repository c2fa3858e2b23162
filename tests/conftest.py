"""Test setup shared by every file.

Without a GPU, Triton kernels run in Triton's interpreter (TRITON_INTERPRET=1, set here before
any kernel is imported), so CPU-only CI still executes the real kernel code on tiny shapes.
Tests marked ``gpu`` need CUDA and are skipped cleanly without it. Tests marked ``slow`` (the
interpreter's sweeps of launch variants, most of the CPU time) are deselected by default and run by
``pytest -m slow`` (CI runs both).
"""

import os

import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")

import pytest  # noqa: E402
from hypothesis import HealthCheck, settings  # noqa: E402

# ci: bounded and derandomised (same examples every run); dev: more; long: for soak runs;
# sanitize: a few, for runs under compute-sanitizer (scripts/gpu_sanitize.sh).
_common = dict(deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
settings.register_profile("ci", max_examples=40, derandomize=True, print_blob=True, **_common)
settings.register_profile("dev", max_examples=200, **_common)
settings.register_profile("long", max_examples=5000, **_common)
settings.register_profile("sanitize", max_examples=8, derandomize=True, **_common)  # under compute-sanitizer
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "ci"))


def pytest_configure(config):
    config.addinivalue_line("markers", "gpu: needs a CUDA device (skipped without one)")
    config.addinivalue_line(
        "markers", "slow: a long sweep under Triton's interpreter; deselected by default (pyproject's addopts); "
                   "`pytest -m slow` runs only these, `pytest -m 'slow or not slow'` everything")


def pytest_collection_modifyitems(config, items):
    if torch.cuda.is_available():
        return
    skip = pytest.mark.skip(reason="needs a CUDA device")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)


@pytest.fixture(autouse=True)
def _fresh_eager_plans():
    """Every test plans its own eager calls: a plan keeps the launchers' module constants as they were
    when it was made, and tests set some of them (the kernels' variants) before their calls."""
    import sgl_convwin

    for value in vars(sgl_convwin).values():
        plans = getattr(value, "eager_plans", None)
        if isinstance(plans, dict):
            plans.clear()
