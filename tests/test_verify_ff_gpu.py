"""Big finite-field products on a GPU (verimirage/smt/ff/gpu.py).

* The device path gives every element the CPU path gives: plain products mod m (one contraction chunk and
  several, near the 2**53 limit of exact float64 sums), exp-fused products, in batch-item and row-block
  steps, from read-only operands. On a CPU-only machine it runs through torch on the CPU
  (``torch-cpu``); the ``gpu`` tests run it on CUDA.
* Small products, other epilogues and the ``cpu`` setting stay on numpy, and leave ``out`` alone.
* Every corpus pair gets the same outcome, output, index and trial with products on the device path, and
  the verdict's evidence says where the products ran.
* A bad setting, or a GPU asked for on a machine without one, is reported naming the variable.
"""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest

import verimirage as vm
from verimirage.ir.errors import GraphError
from verimirage.smt import ff as FF
from verimirage.smt.ff import field as FFfield
from verimirage.smt.ff import gpu as G
from verimirage.smt.ff import products as FFprod

sys.path.insert(0, str(Path(__file__).parent / "cases"))
from corpus import CASES

torch = pytest.importorskip("torch")


@pytest.fixture(autouse=True)
def fresh_setting(monkeypatch):
    """Each test resolves ``$VERIMIRAGE_FF_DEVICE`` afresh (and leaves no resolution behind)."""
    monkeypatch.setattr(G, "_resolved", {})


@pytest.fixture
def on_device(monkeypatch):
    """Products of every size on the device path: CUDA when present, else torch on the CPU."""
    monkeypatch.setenv(G.DEVICE_ENV, "cuda" if torch.cuda.is_available() else "torch-cpu")
    monkeypatch.setattr(G, "MIN_MACS", 0)


def _operands(rng: np.random.Generator, m: int, n: int, rows: int, kk: int, cols: int):
    af = rng.integers(0, m, (n, rows, kk)).astype(np.float64)
    bf = rng.integers(0, m, (n, kk, cols)).astype(np.float64)
    af[..., 0] = m - 1  # the largest residues, so the chunk sums come near 2**53
    bf[:, 0] = m - 1
    af.flags.writeable = False
    bf.flags.writeable = False
    return af, bf


def _exact(af: np.ndarray, bf: np.ndarray, m: int) -> np.ndarray:
    return (np.matmul(af.astype(np.int64).astype(object), bf.astype(np.int64).astype(object)) % m).astype(np.int64)


@pytest.mark.parametrize("shape,slab", [
    ((3, 20, 64, 30), 1 << 20),   # all batch items in one step
    ((3, 20, 64, 30), 700),       # one batch item a step
    ((2, 20, 64, 30), 70),        # row blocks of one item
    ((2, 9, 4500, 7), 1 << 20),   # three contraction chunks, summed in int64
])
def test_products_mod_m_equal_the_exact_ones(on_device, monkeypatch, shape, slab) -> None:
    monkeypatch.setattr(G, "SLAB_ELEMS", slab)
    m = FF.Field.from_seed(7).p
    n, rows, kk, cols = shape
    af, bf = _operands(np.random.default_rng(1), m, n, rows, kk, cols)
    out = G.product(af, bf, ("mod", m), FFprod._CHUNK)
    assert out is not None and out.dtype == np.int64
    assert np.array_equal(out, _exact(af, bf, m))
    assert np.array_equal(out, FFprod._chunked_matmul_mod(af, bf, m))  # (the CPU path agrees too)


@pytest.mark.parametrize("slab", [1 << 20, 50])
def test_exp_fused_products_equal_the_cpu_epilogue(on_device, monkeypatch, slab) -> None:
    monkeypatch.setattr(G, "SLAB_ELEMS", slab)
    fld = FF.Field.from_seed(11)
    af, bf = _operands(np.random.default_rng(2), fld.q, 2, 12, 64, 40)
    out = G.product(af, bf, ("exp", fld.p, fld.q, fld.g), FFprod._CHUNK)
    assert out is not None and out.dtype == np.float64
    expected = FFfield._exp_table(fld.p, fld.q, fld.g)[_exact(af, bf, fld.q)]
    assert np.array_equal(out, expected)
    cpu = np.zeros_like(out)
    FFprod._blocked_matmul(af, bf, cpu, FF.exp_epilogue(fld.p, fld.q, fld.g))
    assert np.array_equal(out, cpu)


def test_a_fused_exp_over_a_long_contraction_is_refused(on_device) -> None:
    fld = FF.Field.from_seed(11)
    af, bf = _operands(np.random.default_rng(3), fld.q, 1, 2, FFprod._CHUNK + 1, 2)
    with pytest.raises(GraphError, match="contraction of at most 2048"):
        G.product(af, bf, ("exp", fld.p, fld.q, fld.g), FFprod._CHUNK)


def test_what_stays_on_the_cpu(monkeypatch) -> None:
    af, bf = _operands(np.random.default_rng(4), 101, 1, 4, 8, 4)
    monkeypatch.setenv(G.DEVICE_ENV, "torch-cpu")
    assert G.product(af, bf, ("mod", 101), FFprod._CHUNK) is None  # small (below MIN_MACS)
    monkeypatch.setattr(G, "MIN_MACS", 0)
    assert G.product(af, bf, ("other", 101), FFprod._CHUNK) is None  # an epilogue it does not know
    assert G.product(af, bf, ("mod", 101), FFprod._CHUNK) is not None
    monkeypatch.setenv(G.DEVICE_ENV, "cpu")
    assert G.device() is None and G.describe() == "cpu"
    assert G.product(af, bf, ("mod", 101), FFprod._CHUNK) is None


def test_a_failing_device_leaves_the_products_to_the_cpu(on_device, monkeypatch, caplog) -> None:
    def fail(*a, **k):
        raise torch.cuda.OutOfMemoryError("CUDA out of memory. Tried to allocate 128.00 MiB")

    monkeypatch.setattr(torch, "bmm", fail)
    monkeypatch.setattr(G, "_warned", set())
    g, m = _gqa_pair()
    with caplog.at_level("WARNING", logger=G.__name__):
        r = FF.ff_test(g, m)
    assert r.outcome == "proved" and r.device.endswith("(some products on the CPU: the device failed)")
    warnings = [rec.getMessage() for rec in caplog.records if rec.name == G.__name__]
    assert len(warnings) == 1 and "out of memory" in warnings[0] and "on the CPU" in warnings[0]
    af, bf = _operands(np.random.default_rng(7), 101, 1, 4, 8, 4)
    assert G.product(af, bf, ("mod", 101), FFprod._CHUNK) is None


@pytest.mark.parametrize("kind", ["mod", "exp"])
def test_a_device_that_rounds_is_caught_by_the_spot_check(on_device, monkeypatch, caplog, kind) -> None:
    exact_bmm = torch.bmm
    monkeypatch.setattr(torch, "bmm", lambda a, b: exact_bmm(a, b) + 1.0)  # (as if every sum were rounded up)
    monkeypatch.setattr(G, "_warned", set())
    fld = FF.Field.from_seed(9)
    m = fld.p if kind == "mod" else fld.q
    af, bf = _operands(np.random.default_rng(8), m, 2, 30, 64, 50)
    tag = ("mod", m) if kind == "mod" else ("exp", fld.p, fld.q, fld.g)
    with caplog.at_level("WARNING", logger=G.__name__):
        assert G.product(af, bf, tag, FFprod._CHUNK) is None
    assert "differs from its exact value" in caplog.text
    monkeypatch.setattr(torch, "bmm", exact_bmm)
    assert G.product(af, bf, tag, FFprod._CHUNK) is not None


def test_auto_uses_a_gpu_only_once_cuda_is_started(monkeypatch) -> None:
    monkeypatch.delenv(G.DEVICE_ENV, raising=False)
    assert G.setting() == "auto"
    monkeypatch.setattr(torch.cuda, "is_initialized", lambda: False)
    assert G.device() is None and G.describe() == "cpu"
    monkeypatch.setattr(torch.cuda, "is_initialized", lambda: True)  # (as after a search profiled kernels)
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 0)
    assert G.device() == torch.device("cuda", 0)
    monkeypatch.delitem(sys.modules, "torch")  # torch not loaded: CUDA not started, and not imported for this
    assert G.device() is None
    assert "torch" not in sys.modules


def test_cuda_is_started_in_the_background_only_where_the_gpu_would_be_used(monkeypatch) -> None:
    monkeypatch.delenv(G.DEVICE_ENV, raising=False)
    started = []
    monkeypatch.setattr(torch.cuda, "init", lambda: started.append(True))
    monkeypatch.setattr(torch.cuda, "is_initialized", lambda: False)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert G.start_cuda_in_background() is None  # no GPU
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setenv(G.DEVICE_ENV, "cpu")
    assert G.start_cuda_in_background() is None  # products kept on the CPU
    monkeypatch.setenv(G.DEVICE_ENV, "auto")
    t = G.start_cuda_in_background()
    assert t is not None
    t.join(10)
    assert started == [True]


def test_only_a_profiling_search_starts_cuda(monkeypatch) -> None:
    pytest.importorskip("egglog")
    calls = []
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)  # (no profiling either)
    monkeypatch.setattr(G, "start_cuda_in_background", lambda: calls.append(True))
    g = vm.benchmarks.get("lora", batch=1, small=True)
    vm.superoptimize(g, time_budget_s=5, profile=False, cache=False, progress=False)
    assert calls == []
    vm.superoptimize(g, time_budget_s=5, profile=True, cache=False, progress=False)
    assert calls == [True]


@pytest.mark.parametrize("value,message", [
    ("gpu", "expected auto, cpu, cuda, cuda:N or torch-cpu"),
    ("cuda:x", "VERIMIRAGE_FF_DEVICE"),
])
def test_a_bad_setting_is_reported(monkeypatch, value, message) -> None:
    monkeypatch.setenv(G.DEVICE_ENV, value)
    if value.startswith("cuda") and not torch.cuda.is_available():
        message = "sees no CUDA GPU"
    with pytest.raises(GraphError, match=message):
        G.device()


@pytest.mark.skipif(torch.cuda.is_available(), reason="this machine has a GPU")
def test_a_gpu_asked_for_without_one_is_reported(monkeypatch) -> None:
    monkeypatch.setenv(G.DEVICE_ENV, "cuda")
    with pytest.raises(GraphError, match=r"VERIMIRAGE_FF_DEVICE='cuda', but torch sees no CUDA GPU"):
        vm.verify(*_gqa_pair())


def _gqa_pair() -> tuple[vm.Graph, vm.Graph]:
    g = vm.benchmarks.get("gqa", batch=1, small=True)
    return g, vm.benchmarks.expert("gqa", g)


@pytest.mark.parametrize("case", CASES, ids=[c.name for c in CASES])
def test_the_device_changes_no_outcome(case, monkeypatch) -> None:
    a, b = case.a(), case.b()
    monkeypatch.setattr(FFprod, "_BLOCK_ELEMS", 16)  # (every product of more than a few elements blocked)
    monkeypatch.setenv(G.DEVICE_ENV, "cpu")
    on_cpu = FF.ff_test(a, b)
    monkeypatch.setenv(G.DEVICE_ENV, "cuda" if torch.cuda.is_available() else "torch-cpu")
    monkeypatch.setattr(G, "MIN_MACS", 0)
    moved = FF.ff_test(a, b)
    assert on_cpu.device == "cpu" and moved.device != "cpu"
    assert moved.outcome == on_cpu.outcome, (case.name, moved.reason, on_cpu.reason)
    assert (moved.output, moved.index, moved.field_trial) == (on_cpu.output, on_cpu.index, on_cpu.field_trial)


def test_the_evidence_says_where_the_products_ran(on_device) -> None:
    v = vm.verify(*_gqa_pair())
    assert isinstance(v, vm.Proved)
    where = next(c for c in v.evidence if c.name == "finite-field").param("products_on")
    assert where == G.describe() and where != "cpu"


@pytest.mark.gpu
def test_a_batch8_attention_product_on_the_gpu_equals_the_cpu(monkeypatch) -> None:
    # the gqa b8 target's Q K^T with exp fused, at full size (16 x 256 x 4096, contraction 64)
    monkeypatch.setenv(G.DEVICE_ENV, "cuda")
    fld = FF.Field.from_seed(3)
    af, bf = _operands(np.random.default_rng(5), fld.q, 16, 256, 64, 4096)
    tag = ("exp", fld.p, fld.q, fld.g)
    out = G.product(af, bf, tag, FFprod._CHUNK)
    assert out is not None
    monkeypatch.setenv(G.DEVICE_ENV, "cpu")
    idx = FFprod._chunked_matmul_mod(af, bf, fld.q)
    assert np.array_equal(out, FFfield._exp_table(fld.p, fld.q, fld.g)[idx])


@pytest.mark.gpu
def test_results_are_page_locked_within_the_cap(monkeypatch) -> None:
    monkeypatch.setenv(G.DEVICE_ENV, "cuda")
    monkeypatch.setattr(G, "MIN_MACS", 0)
    fld = FF.Field.from_seed(3)
    af, bf = _operands(np.random.default_rng(6), fld.p, 2, 64, 64, 256)
    before = G.pinned_bytes()
    x = G.product(af, bf, ("mod", fld.p), FFprod._CHUNK)
    assert x is not None and G.pinned_bytes() == before + x.nbytes
    view = x[1, 3:7].T  # a view keeps the memory (and its count) alive
    del x
    assert G.pinned_bytes() == before + 2 * 64 * 256 * 8
    assert np.array_equal(view, _exact(af, bf, fld.p)[1, 3:7].T)
    del view
    assert G.pinned_bytes() == before
    monkeypatch.setattr(G, "PINNED_BYTES", before + 1000)  # over the cap: ordinary memory, the same values
    y = G.product(af, bf, ("mod", fld.p), FFprod._CHUNK)
    assert G.pinned_bytes() == before and np.array_equal(y, _exact(af, bf, fld.p))
