"""Backend: disk cache, GPU selection (keys on CPU, timing on a GPU), torch.library integration."""

from __future__ import annotations

import json
import logging
import os
import threading
from pathlib import Path

import pytest
import torch

import verimirage as vm
from verimirage.backend.cache import DiskCache, atomic_write, cache_dir, key_of
from verimirage.backend.codegen import LaunchConfig, TileOptions
from verimirage.backend.profile import DEFAULT_CONFIGS, select, selection_key
from verimirage.backend.runtime import ensure_mode
from verimirage.benchmarks.designs import expert, small_design_kw

ensure_mode()  # CPU-only machine: TRITON_INTERPRET=1 before anything imports triton

needs_gpu = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
#: Where kernels run: the GPU when there is one (compiled kernels reject CPU tensors there), else the CPU
#: (the interpreter).
DEV = "cuda" if torch.cuda.is_available() else "cpu"


@pytest.fixture(autouse=True)
def _cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("VERIMIRAGE_CACHE_DIR", str(tmp_path / "cache"))


def test_cache_dir_env_override(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    assert cache_dir() == tmp_path / "cache" and cache_dir().is_dir()
    monkeypatch.delenv("VERIMIRAGE_CACHE_DIR")
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert cache_dir() == tmp_path / "xdg" / "verimirage"


def test_disk_cache_roundtrip_and_key_stability() -> None:
    c = DiskCache("t")
    k = key_of({"b": 1, "a": [1, 2]})
    assert k == key_of({"a": [1, 2], "b": 1})
    assert c.get(k) is None
    c.put(k, {"ms": 1.5})
    assert c.get(k) == {"ms": 1.5}
    with pytest.raises(ValueError, match="hex digest"):
        c.path("../escape")


@pytest.mark.parametrize("bad", ["{not json", json.dumps({"format": 99, "key": "x", "value": 1}), ""])
def test_corrupt_entries_are_discarded_with_a_warning(bad: str, caplog: pytest.LogCaptureFixture) -> None:
    c = DiskCache("t")
    k = key_of({"x": 1})
    c.path(k).write_text(bad)
    with caplog.at_level(logging.WARNING):
        assert c.get(k) is None
    assert "corrupt" in caplog.text
    assert not c.path(k).exists()
    c.put(k, 3)
    assert c.get(k) == 3


def test_atomic_write_leaves_no_partial_files(tmp_path: Path) -> None:
    p = tmp_path / "d" / "f.json"
    errors: list[Exception] = []

    def writer(i: int) -> None:
        try:
            for _ in range(20):
                atomic_write(p, json.dumps({"i": i, "pad": "x" * 10000}))
        except Exception as e:  # pragma: no cover
            errors.append(e)

    ts = [threading.Thread(target=writer, args=(i,)) for i in range(4)]
    for t in ts:
        t.start()
    for _ in range(50):
        if p.exists():
            assert json.loads(p.read_text())["pad"] == "x" * 10000  # never half-written
    for t in ts:
        t.join()
    assert not errors
    assert os.listdir(p.parent) == ["f.json"]


def test_selection_key_covers_gpu_versions_shapes_strides_configs() -> None:
    g = vm.benchmarks.get("gated_mlp", small=True)
    cands = [expert("gated_mlp", g, **small_design_kw("gated_mlp")), g]
    meta = [{"name": t.name, "shape": list(t.shape), "dtype": "f16", "stride": [t.shape[-1], 1]} for t in g.inputs]
    dev = {"name": "NVIDIA H100 80GB HBM3", "capability": [9, 0]}
    ver = {"verimirage": "0.1.0", "triton": "3.6.0", "torch": "2.13"}
    base = selection_key(g, cands, DEFAULT_CONFIGS, meta, dev, ver)
    assert base == selection_key(g, list(cands), DEFAULT_CONFIGS, meta, dict(dev), dict(ver))
    variants = [
        selection_key(g, cands, DEFAULT_CONFIGS, meta, {**dev, "name": "NVIDIA A100"}, ver),
        selection_key(g, cands, DEFAULT_CONFIGS, meta, {**dev, "capability": [8, 0]}, ver),
        selection_key(g, cands, DEFAULT_CONFIGS, meta, dev, {**ver, "triton": "3.5.0"}),
        selection_key(g, cands, DEFAULT_CONFIGS, meta, dev, {**ver, "torch": "2.12"}),
        selection_key(g, cands, DEFAULT_CONFIGS, meta, dev, {**ver, "verimirage": "0.2.0"}),
        selection_key(g, cands, DEFAULT_CONFIGS, [{**meta[0], "stride": [1, 8]}, *meta[1:]], dev, ver),
        selection_key(g, cands, DEFAULT_CONFIGS[:2], meta, dev, ver),
        selection_key(g, cands[:1], DEFAULT_CONFIGS, meta, dev, ver),
        selection_key(vm.benchmarks.get("gated_mlp", small=True, dtype=vm.float32), cands, DEFAULT_CONFIGS, meta,
                      dev, ver),
    ]
    assert len({base, *variants}) == len(variants) + 1


def test_config_validation() -> None:
    with pytest.raises(ValueError, match="num_warps"):
        LaunchConfig(num_warps=3)
    with pytest.raises(ValueError, match="dot_min_m"):
        TileOptions(dot_min_m=8)
    assert LaunchConfig().key() != LaunchConfig(tiles=TileOptions(dot_min_m=128)).key()


@pytest.mark.skipif(torch.cuda.is_available(), reason="CPU-only behaviour")
def test_select_needs_a_gpu() -> None:
    g = vm.benchmarks.get("gated_mlp", small=True)
    with pytest.raises(RuntimeError, match="needs a CUDA GPU"):
        select(g, [g])


@pytest.mark.gpu
@needs_gpu
def test_select_on_gpu_orders_and_caches(tmp_path: Path) -> None:
    g = vm.benchmarks.get("gated_mlp", batch=1)
    cands = [expert("gated_mlp", g), g]
    cfgs = DEFAULT_CONFIGS[:2]
    res = select(g, cands, configs=cfgs, cache_root=tmp_path)
    assert len(res) == 4 and all(t.ok for t in res)
    assert [t.ms for t in res] == sorted(t.ms for t in res)
    again = select(g, cands, configs=cfgs, cache_root=tmp_path)
    assert [(t.index, t.config, t.ms) for t in again] == [(t.index, t.config, t.ms) for t in res]


@pytest.mark.gpu
@needs_gpu
def test_cuda_graph_capture() -> None:
    g = vm.benchmarks.get("gqa_stable", batch=1)
    fn = vm.compile(expert("gqa_stable", g))
    xs = [torch.randn(t.shape, device="cuda").half() for t in g.inputs]
    fn(*xs)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = fn(*xs)
    graph.replay()
    torch.cuda.synchronize()
    torch.testing.assert_close(out, fn(*xs))


def test_torch_library_op_opcheck_and_compile() -> None:
    from verimirage.backend.torch_ops import register

    g = vm.benchmarks.get("gated_mlp", small=True)
    mg = expert("gated_mlp", g, **small_design_kw("gated_mlp"))
    op = register(mg, "test_gated_mlp_small")
    assert register(mg, "test_gated_mlp_small") is op
    with pytest.raises(ValueError, match="already registered"):
        register(g, "test_gated_mlp_small")
    xs = tuple(torch.randn(t.shape, device=DEV).half() * 0.5 for t in g.inputs)
    res = torch.library.opcheck(op.default, xs)
    assert all(v == "SUCCESS" for v in res.values()), res

    def f(x: torch.Tensor, w1: torch.Tensor, w2: torch.Tensor) -> torch.Tensor:
        return op(x, w1, w2).float().sum(dim=1)

    cf = torch.compile(f, backend="aot_eager", fullgraph=True)
    torch.testing.assert_close(cf(*xs), f(*xs))
    torch.testing.assert_close(op(*xs), vm.compile(mg)(*xs))


def test_torch_library_multi_output() -> None:
    from verimirage.backend.torch_ops import register

    g = vm.benchmarks.get("ntrans", small=True)
    op = register(expert("ntrans", g), "test_ntrans_small")
    xs = tuple(torch.randn(t.shape, device=DEV).half() for t in g.inputs)
    res = torch.library.opcheck(op.default, xs)
    assert all(v == "SUCCESS" for v in res.values()), res
    a, b = op(*xs)
    assert a.shape == b.shape == xs[0].shape
