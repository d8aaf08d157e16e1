"""CPU-checkable parts of the GPU harness: the eager baseline computes the suite programs exactly."""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest

import verimirage as vm

torch = pytest.importorskip("torch")
sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "benchmarks"))
from torch_eager import flops, min_bytes, torch_fn  # noqa: E402


@pytest.mark.parametrize("name", vm.benchmarks.names())
def test_eager_baseline_matches_reference(name: str) -> None:
    g = vm.benchmarks.get(name, batch=2, small=True)
    gen = torch.Generator().manual_seed(1)
    ins = [torch.randn(t.shape, generator=gen, dtype=torch.float64) for t in g.inputs]
    got = torch_fn(g)(*ins)
    got = got if isinstance(got, tuple) else (got,)
    want = vm.evaluate(g, {t.name: x for t, x in zip(g.inputs, ins, strict=True)})
    for a, b in zip(got, want, strict=True):
        np.testing.assert_allclose(a.numpy(), b, rtol=1e-10, atol=1e-12)


def test_floor_inputs() -> None:
    g = vm.benchmarks.get("gated_mlp", batch=1)
    assert flops(g) == 2 * 2 * 8 * 4096 * 4096
    assert min_bytes(g) == 2 * (8 * 4096 + 2 * 4096 * 4096 + 8 * 4096)


@pytest.mark.parametrize("name", vm.benchmarks.model_names())
def test_eager_baseline_matches_reference_on_the_models_set(name: str) -> None:
    g = vm.benchmarks.get_model(name, small=True)
    gen = torch.Generator().manual_seed(2)
    ins = [(torch.rand(t.shape, generator=gen) > 0.5).double() if t.dtype is vm.bool
           else torch.randn(t.shape, generator=gen, dtype=torch.float64).abs() + 0.5 if t.name == "VAR"
           else torch.randn(t.shape, generator=gen, dtype=torch.float64) for t in g.inputs]
    got = torch_fn(g)(*ins)
    got = got if isinstance(got, tuple) else (got,)
    want = vm.evaluate(g, {t.name: x.numpy() for t, x in zip(g.inputs, ins, strict=True)})
    for a, b in zip(got, want, strict=True):
        np.testing.assert_allclose(a.numpy(), b, rtol=1e-9, atol=1e-11)


def test_spearman_and_the_merged_models_summary(tmp_path: Path) -> None:
    import json

    import bench
    import merge_results

    assert bench.spearman([1, 2, 3, 4], [10, 20, 30, 40]) == pytest.approx(1.0)
    assert bench.spearman([1, 2, 3, 4], [4, 3, 2, 1]) == pytest.approx(-1.0)
    assert bench.spearman([1, 1, 2], [1, 2, 3]) == pytest.approx(0.8660254)  # ties take the average rank
    assert bench.spearman([1, 2], [1, 2]) is None and bench.spearman([1, 1, 1], [1, 2, 3]) is None

    def doc(rows: list[dict]) -> dict:
        return {"device": "d", "date": "x", "torch": "t", "triton": "t", "set": "models", "rows": rows,
                "ceilings": {"copy_bytes_per_s": 3e12, "bf16_flops_per_s": 7e14, "launch_us": 1.2}}

    def row(case: str, meas: list[float]) -> dict:
        cvm = [{"rank": i, "kernels": 1, "cost_us": float(i + 1), "measured_us": m} for i, m in enumerate(meas)]
        return {"case": case, "cost_vs_measured": cvm, "spearman": bench.spearman([1.0, 2.0, 3.0], meas),
                "floor_us": 1.0, "verimirage_us": 2.0, "speedup_vs_best": 1.0, "floor_fraction": 0.5}

    a, b = tmp_path / "a.json", tmp_path / "b.json"
    a.write_text(json.dumps(doc([row("p", [3.0, 2.0, 1.0]), row("q", [1.0, 2.0, 3.0])])))
    b.write_text(json.dumps(doc([row("p", [1.0, 2.0, 3.0])])))  # p re-measured: its row replaces run 1's
    merge_results.main([str(tmp_path / "m.json"), str(a), str(b)])
    m = json.loads((tmp_path / "m.json").read_text())
    assert [(r["case"], r["run"]) for r in m["rows"]] == [("p", 1), ("q", 0)]
    assert m["spearman"]["within_mean"] == pytest.approx(1.0) and m["spearman"]["pairs"] == 6


def test_programs_are_classified_by_what_bounds_them() -> None:
    import bench

    ceil = {"copy_bytes_per_s": 3e12, "bf16_flops_per_s": 7e14, "launch_us": 1.2}
    # decode-size logsumexp (16 x 32000 fp16): 1 MB, 0.34 us at 3 TB/s: below one launch
    assert bench.classify(16 * 32000 * 2, 0, ceil) == "launch"
    # the prefill size (2048 tokens): 131 MB, 44 us
    assert bench.classify(2048 * 32000 * 2, 2048 * 32000 * 4, ceil) == "memory"
    # a square fp16 matmul of 4096: 100 MB moved, 137 GFLOP (196 us at 0.7 PFLOP/s)
    assert bench.classify(3 * 4096 * 4096 * 2, 2 * 4096**3, ceil) == "compute"
    doc = {"device": "d", "date": "x", "torch": "t", "triton": "t", "set": "models",
           "ceilings": ceil, "rows": [
               {"case": "a", "bound": "memory", "floor_us": 10.0, "verimirage_us": 12.0, "floor_fraction": 10 / 12},
               {"case": "b", "bound": "memory", "floor_us": 10.0, "verimirage_us": 20.0, "floor_fraction": 0.5},
               {"case": "c", "bound": "launch", "floor_us": 0.3, "verimirage_us": 2.4, "floor_fraction": 0.5}]}
    text = bench.table(doc)
    assert "| memory |" in text and "| launch |" in text
    assert "Memory-bound programs at >= 70% of their floor: 1/2." in text
    assert "Launch-bound programs at >= 70% of their floor (the launch floor" in text


def test_rotation_moves_twice_the_l2_per_replay(monkeypatch: pytest.MonkeyPatch) -> None:
    # bench.py --rotate (issue 22, session 13c): qkv_bias's 33 MB of weights partly stayed in the H100's 50 MB L2
    # between warm replays (run 16, H100: eager 11.3 us warm against an 11.2 us copy floor, 17.0 us rotated)
    import types

    import bench

    props = types.SimpleNamespace(L2_cache_size=50 * 2**20)
    monkeypatch.setattr(bench.torch.cuda, "get_device_properties", lambda i=0: props)
    assert bench.rotation(33.3e6, False) == 1
    assert bench.rotation(33.3e6, True) == 4  # 4 x 33 MB > 2 x 50 MB
    assert bench.rotation(1.0e6, True) == 8  # at most 8 sets
    assert bench.rotation(268e6, True) == 1  # already past the L2
    calls: list[int] = []
    monkeypatch.setattr(bench, "bench", lambda fn, cudagraph: (fn(), 12.0)[1])
    got = bench.bench_sets(lambda x: calls.append(x), [[1], [2], [3]])
    assert got == 4.0 and calls == [1, 2, 3]
    assert bench.bench_sets(lambda x: calls.append(x), [[7]]) == 12.0 and calls[-1] == 7


def test_rel_error_on_torch_tensors_is_the_numpy_measure() -> None:
    # bench.py passes its float64 reference (a GPU tensor) to profile.select, which compares each candidate on the
    # reference's device (profile._rel_error_torch) instead of copying a 2048 x 32000 output to numpy per config:
    # the same three terms, the median of an even count the mean of the two middle values
    from verimirage.backend.profile import TOLERANCE, rel_error

    gen = np.random.default_rng(3)
    cases = [(np.array([1e6, 5.0, 5.0, 5.0]), np.array([1e6, 1.0, 1.0, 1.0]), "f16"),  # one small element off
             (np.array([1e6, 1.0, 1.0, 1.0 + 200 * TOLERANCE["f16"]]), np.array([1e6, 1.0, 1.0, 1.0]), "f16"),
             (np.array([0.0, 2.0, -3.0]), np.array([0.0, 2.0, -3.0 + 1e-3]), "f32"),
             (np.array([1.0, np.nan]), np.array([1.0, 2.0]), "f16")]
    for n in (7, 8, 1000):
        r = gen.standard_normal((n, 3)) * np.where(gen.random((n, 3)) < 0.2, 0.0, 1.0)
        cases.append((r + 1e-3 * gen.standard_normal((n, 3)), r, "bf16"))
        cases.append((r.astype(np.float16).astype(np.float64), r, "f16"))
    for got, ref, dt in cases:
        want = rel_error(got, ref, dt)
        have = rel_error(torch.from_numpy(got), torch.from_numpy(ref), dt)
        assert have == pytest.approx(want, rel=1e-12) or (have == want == float("inf")), (got, ref)
    bad = torch.tensor([1e6, 5.0, 5.0, 5.0], dtype=torch.float16)  # an fp16 output against a float64 reference
    assert rel_error(bad, torch.tensor([1e6, 1.0, 1.0, 1.0], dtype=torch.float64)) > TOLERANCE["f16"]


@pytest.mark.slow
def test_prewarm_locks_inductor_benchmarking_once(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    # the models set in one device call: torch.compile's autotuning runs in the prewarm pool, its GPU timings one
    # worker at a time (bench._gpu_lock around every benchmark method of Inductor's benchmarker classes)
    import fcntl

    import bench
    from torch._inductor.runtime import benchmarking

    monkeypatch.setattr(bench, "GPU_LOCK", str(tmp_path / "gpu.lock"))
    saved = {(c, a): f for c in vars(benchmarking).values() if isinstance(c, type)
             for a, f in vars(c).items() if a.startswith("benchmark")}
    try:
        n = bench._lock_inductor_benchmarks()
        assert n >= 2 and bench._lock_inductor_benchmarks() == 0  # wrapped once
    finally:
        for (c, a), f in saved.items():
            setattr(c, a, f)
    held: list[bool] = []

    def probe() -> None:  # another open file description cannot take the lock while it is held
        with open(bench.GPU_LOCK, "a") as fh:
            try:
                fcntl.flock(fh, fcntl.LOCK_EX | fcntl.LOCK_NB)
                fcntl.flock(fh, fcntl.LOCK_UN)
                held.append(False)
            except BlockingIOError:
                held.append(True)

    import os

    before = os.getpriority(os.PRIO_PROCESS, 0)
    inside: list[int] = []
    outer = bench._gpu_lock(lambda: (inside.append(os.getpriority(os.PRIO_PROCESS, 0)), bench._gpu_lock(probe)()))
    outer()  # re-entrant: the inner call does not deadlock
    probe()
    assert held == [True, False]
    # the timing thread outranks the compiling workers while it holds the lock (where the OS lets it), and gets
    # its own priority back after
    assert os.getpriority(os.PRIO_PROCESS, 0) == before
    assert inside[0] == bench.TIMING_NICE or (os.geteuid() != 0 and inside[0] == before)


def test_the_gpu_lock_holder_times_on_cpus_the_prewarm_compiles_never_use(monkeypatch: pytest.MonkeyPatch,
                                                                          tmp_path: Path) -> None:
    """The prewarm workers compile on all CPUs but the last ``TIMING_CPUS``; the thread holding the GPU lock (its
    Inductor benchmarking) moves to those while it times, and back after (H100, 2026-11-27: baselines autotuned in
    the pool at nice -5 alone still ran up to 1.4x slower than compiled alone)."""
    import os

    import bench

    monkeypatch.setattr(bench, "_CPUS", tuple(range(16)))
    compile_cpus, timing_cpus = bench._cpu_split()
    assert timing_cpus == {16 - bench.TIMING_CPUS + i for i in range(bench.TIMING_CPUS)}
    assert compile_cpus == set(range(16 - bench.TIMING_CPUS))
    monkeypatch.setattr(bench, "_CPUS", (0, 1))  # too few to reserve any: both sides get all
    assert bench._cpu_split() == ({0, 1}, {0, 1})
    mine = os.sched_getaffinity(0)
    one = {min(mine)}
    monkeypatch.setattr(bench, "_cpu_split", lambda: (set(mine), one))
    monkeypatch.setattr(bench, "GPU_LOCK", str(tmp_path / "gpu.lock"))
    inside: list[set[int]] = []
    bench._gpu_lock(lambda: inside.append(os.sched_getaffinity(0)))()
    assert inside == [one] and os.sched_getaffinity(0) == mine


def test_inductor_repeats_takes_fresh_compiles_and_skips_a_wrong_one(monkeypatch: pytest.MonkeyPatch) -> None:
    # --inductor-repeats: each later compile runs with Inductor's caches off (max-autotune's choice moves between
    # compiles), a compile whose result is wrong is not timed, and the caches are switched back on afterwards
    import bench
    import torch._inductor.config as icfg

    seen_caches_off: list[bool] = []
    outs = iter([torch.ones(3) * 5.0, torch.ones(3)])  # the first recompile is wrong, the second right
    times = iter([7.0])

    def fake_compile(f: object, mode: str) -> object:
        assert mode == bench.INDUCTOR_MODE
        seen_caches_off.append(bool(icfg.force_disable_caches))
        out = next(outs)
        return lambda *a: out

    monkeypatch.setattr(torch, "compile", fake_compile)
    monkeypatch.setattr(bench, "bench_sets", lambda cf, sets: next(times))
    got = bench._recompiled_inductor_us(lambda x: x, (torch.ones(3),), torch.ones(3), [], 2)
    assert got == [7.0]
    assert seen_caches_off == [True, True]
    assert not icfg.force_disable_caches


def test_a_verified_candidate_wrong_on_the_gpu_is_listed_in_the_table() -> None:
    # group_norm's candidates 2/3 failed the profiler's float64 check in every models run since run 17 (a Triton
    # miscompile at 16 warps) and the only trace was an "error" field deep in models.json
    import bench

    ceil = {"copy_bytes_per_s": 3e12, "bf16_flops_per_s": 7e14, "launch_us": 1.2}
    bad = "ValueError: output differs from the float64 reference: rel. error inf > 0.002 (f16)"
    doc = {"device": "d", "date": "x", "torch": "t", "triton": "t", "set": "models", "ceilings": ceil, "rows": [
        {"case": "gn", "bound": "memory", "floor_us": 10.0, "verimirage_us": 12.0, "floor_fraction": 10 / 12,
         "candidates": [{"rank": 0, "config": "c", "ms": 0.012, "error": None},
                        {"rank": 2, "config": "w16", "ms": None, "error": bad},
                        {"rank": 3, "config": "c", "ms": None, "error": "OutOfResources: shared memory"}]}]}
    assert [(w["case"], w["rank"]) for w in bench.wrong_on_gpu(doc["rows"])] == [("gn", 2)]
    text = bench.table(doc)
    assert "failed the float64 check: 1" in text and "gn #2 (w16)" in text
    doc["rows"][0]["candidates"].pop(1)
    assert "failed the float64 check: 0" in bench.table(doc)
