"""Red team (fifteenth session, redteam2): silently wrong results and crashes on the user-facing execution paths
(``torch.compile(backend="verimirage")``, ``vm.compile`` and its launch modes, ``vm.testing``, the capture's numeric
check), each with the test that failed before its fix. The attacks that held are in
``tests/test_redteam2_held15.py``."""

from __future__ import annotations

from typing import Any

import pytest

torch = pytest.importorskip("torch")

# no numeric check: what the lifting builds is what the kernels compute (the check is a backstop, not the proof)
UNCHECKED: dict[str, Any] = {"time_budget_s": 8.0, "fallback": "eager", "candidates": 1, "check": False}


def _compiled(fn: Any, **opts: Any) -> tuple[Any, Any]:
    from verimirage.integrations.dynamo import backend
    from verimirage.integrations.report import Report

    rep = Report()
    torch._dynamo.reset()
    return torch.compile(fn, backend=backend(report=rep, **{**UNCHECKED, **opts})), rep


def test_rsub_with_alpha_dropped_alpha() -> None:
    """Finding (medium): ``torch.rsub(x, c, alpha=a)`` is ``c - a x``; the lifting read ``rsub`` as ``c - x`` (alpha
    was applied only to ``add``/``sub``), so the verified kernels computed another function. The numeric check then
    refused the partition, but with ``check=False`` (a documented option) the compiled model returned ``c - x``
    silently. Now alpha scales ``self`` in ``rsub`` (and ``other`` in ``add``/``sub``)."""
    x, w = torch.randn(4, 6), torch.randn(6, 5)
    for fn in (lambda x, w: torch.rsub(x @ w, 2.0, alpha=3.0),
               lambda x, w: torch.rsub(x @ w, w.sum(0), alpha=-0.5),
               lambda x, w: torch.sub(x @ w, w.sum(0), alpha=3.0)):
        cm, rep = _compiled(fn)
        with torch.no_grad():
            got, want = cm(x, w), fn(x.double(), w.double())
        assert any(p.taken for p in rep.partitions), rep
        torch.testing.assert_close(got.double(), want, rtol=1e-4, atol=1e-4)
