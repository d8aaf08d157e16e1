"""Shared test configuration: GPU tests skip without CUDA; hypothesis profiles for CI."""

from __future__ import annotations

import os
import tempfile

# Caches (generated kernels, search results) go to a fresh directory per test session, never ~/.cache.
os.environ.setdefault("VERIMIRAGE_CACHE_DIR", tempfile.mkdtemp(prefix="vm-test-cache-"))

# Triton's interpreter must be chosen before anything imports triton: do it first, for every test module.
from verimirage.backend.runtime import ensure_mode

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
