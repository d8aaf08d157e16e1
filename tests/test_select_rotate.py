"""The profiler ranks candidates over several input sets (``profile.select(input_sets=)``, issue 22): each timing
replays the program once per set and is divided by their count, so programs whose inputs fit in L2 are ranked as the
harness reports them (rotated, L2-cold). Warm, run 17's profiled qkv_bias pick ran 15.1 us rotated against 13.9 for
the default candidate (H100, 2026-11-26). Checked on the CPU with interpreted kernels and a fake GPU clock."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

import verimirage as vm


def _graph() -> vm.Graph:
    g = vm.Graph()
    x = g.input("x", (16, 32), vm.float16)
    b = g.input("b", (1, 32), vm.float16)
    g.output(g.relu(g.add(x, b)))
    return g


def _setup(monkeypatch: pytest.MonkeyPatch) -> tuple[Any, Any, list[int]]:
    torch = pytest.importorskip("torch")
    import triton.testing

    from verimirage.backend import profile

    monkeypatch.setattr(profile, "device_info", lambda: {"name": "fake", "capability": [9, 0]})
    monkeypatch.setattr(torch.cuda, "synchronize", lambda *a, **k: None)
    calls: list[int] = []

    def bench(fn: Any, rep: int = 0, return_mode: str = "") -> float:
        out = fn()
        calls.append(len(out))  # (the timed callable returns one result per input set)
        return 12.0

    monkeypatch.setattr(triton.testing, "do_bench_cudagraph", bench)
    monkeypatch.setattr(triton.testing, "do_bench", bench)
    return torch, profile, calls


def _inputs(torch: Any, g: vm.Graph, seed: int) -> dict[str, Any]:
    gen = torch.Generator().manual_seed(seed)
    return {t.name: (torch.randn(t.shape, generator=gen) * 0.5).to(torch.float16) for t in g.inputs}


def test_select_times_every_input_set_and_divides_by_their_count(monkeypatch: pytest.MonkeyPatch,
                                                                  tmp_path: Path) -> None:
    torch, profile, calls = _setup(monkeypatch)
    g = _graph()
    xs, more = _inputs(torch, g, 0), [_inputs(torch, g, s) for s in (1, 2, 3)]
    configs = profile.DEFAULT_CONFIGS[:1]
    warm = profile.select(g, [g], configs=configs, inputs=xs, cache_root=tmp_path)
    assert calls == [1] and warm[0].ms == 12.0
    rotated = profile.select(g, [g], configs=configs, inputs=xs, input_sets=more, cache_root=tmp_path)
    assert calls == [1, 4] and rotated[0].ms == 3.0  # not the warm selection's cache entry: measured again
    assert len(list((tmp_path / "select").glob("*.json"))) == 2


def test_select_refuses_an_input_set_unlike_the_inputs(monkeypatch: pytest.MonkeyPatch) -> None:
    torch, profile, _ = _setup(monkeypatch)
    g = _graph()
    xs = _inputs(torch, g, 0)
    for bad in ({"x": xs["x"]}, {"x": xs["x"], "b": xs["b"].float()},
                {"x": xs["x"].t().contiguous().t(), "b": xs["b"]}, {"x": xs["x"][:8], "b": xs["b"]}):
        with pytest.raises(ValueError, match=r"input set 1: input '(x|b)'.*expected"):
            profile.select(g, [g], configs=profile.DEFAULT_CONFIGS[:1], inputs=xs, input_sets=[bad], cache=False)


def _tiled(rows: int) -> vm.MuGraph:
    """relu(X + B) over (16, 32) in blocks of ``rows`` rows (at most 4: runs of at most 256 bytes): flat under the
    tuning rules, so every such ``rows`` gives the same kernel."""
    return vm.MuGraph.parse(f"""mugraph {{
  %0 = input {{name='x'}} : f16[16,32]
  %1 = input {{name='b'}} : f16[1,32]
  %2 = custom %0, %1 {{frange=1, grid=({16 // rows},)}} : f16[16,32] {{
    %0 = input {{arg=0, fmap=None, imap=(0,), shape=(16, 32)}} : f16[{rows},32]
    %1 = input {{arg=1, fmap=None, imap=(None,), shape=(1, 32)}} : f16[1,32]
    %2 = add %0, %1 : f16[{rows},32]
    %3 = relu %2 : f16[{rows},32]
    output %3 {{omap=(0,)}}
  }}
  return %2
}}""")


def test_candidates_generating_the_same_module_are_timed_once(monkeypatch: pytest.MonkeyPatch) -> None:
    torch, profile, calls = _setup(monkeypatch)
    g = _graph()
    cands = [_tiled(4), _tiled(2), _tiled(1)]
    res = profile.select(g, cands, configs=profile.DEFAULT_CONFIGS[:1], inputs=_inputs(torch, g, 0), cache=False)
    assert calls == [1], [t.error for t in res]  # one module, timed once
    assert sorted(t.index for t in res) == [0, 1, 2] and {t.ms for t in res} == {12.0}
    # tiled as their block graphs say, they differ, and each is timed
    calls.clear()
    tiled = profile.LaunchConfig(4, 1, profile.TileOptions())
    profile.select(g, cands, configs=[tiled], inputs=_inputs(torch, g, 0), cache=False)
    assert calls == [1, 1, 1]
