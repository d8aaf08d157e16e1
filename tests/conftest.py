"""Shared test configuration: GPU tests skip without CUDA; hypothesis profiles for CI."""

from __future__ import annotations

import atexit
import os
import shutil
import tempfile


def _private_caches() -> None:
    """Caches (generated kernels, search results, Triton's compiles) go to a fresh directory per test process,
    never ~/.cache, and are removed when the process ends. Under pytest-xdist every worker gets its own: a
    worker inherits the controller's environment, so a directory this file made (named in VM_TEST_OWN_CACHE)
    is replaced in each worker, while one the user set in VERIMIRAGE_CACHE_DIR is kept."""
    own = os.environ.get("VM_TEST_OWN_CACHE")
    current = os.environ.get("VERIMIRAGE_CACHE_DIR")
    if current is not None and current != own:
        return  # the user's own choice
    d = tempfile.mkdtemp(prefix=f"vm-test-cache-{os.environ.get('PYTEST_XDIST_WORKER', 'main')}-")
    atexit.register(shutil.rmtree, d, True)
    os.environ["VM_TEST_OWN_CACHE"] = d
    os.environ["VERIMIRAGE_CACHE_DIR"] = d
    if os.environ.get("TRITON_CACHE_DIR") in (None, os.path.join(own or "", "triton")):
        os.environ["TRITON_CACHE_DIR"] = os.path.join(d, "triton")


_private_caches()

# Triton's interpreter must be chosen before anything imports triton: do it first, for every test module.
from verimirage.backend.runtime import ensure_mode  # noqa: E402

ensure_mode()

import pytest  # noqa: E402
from hypothesis import HealthCheck, settings  # noqa: E402

settings.register_profile(
    "ci", max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow], derandomize=True
)
settings.register_profile("dev", max_examples=100, deadline=None, suppress_health_check=[HealthCheck.too_slow])
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "ci"))


def _has_cuda() -> bool:
    try:
        import torch

        return bool(torch.cuda.is_available())
    except Exception:  # torch missing or broken: no GPU tests
        return False


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if _has_cuda():
        return
    skip = pytest.mark.skip(reason="needs a CUDA GPU (run on the device machine)")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)
