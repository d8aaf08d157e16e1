"""The capture's numeric-check diagnosis (``VERIMIRAGE_CAPTURE_DUMP``): what a failing partition's kernels computed
against its ATen ops, their float64 reference and the μGraph's own float64 value on the same inputs, so a device run
tells a kernel that disagrees with its verified μGraph (a code-generation bug) from rounding the check holds too
strictly (issue 20: the H200 training run's "output k differs from the ATen ops" rejections)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

torch = pytest.importorskip("torch")

import verimirage as vm  # noqa: E402
from verimirage.integrations import capture  # noqa: E402


def _partition() -> tuple[Any, Any, list[Any]]:
    from torch.fx.experimental.proxy_tensor import make_fx

    def f(a: Any, b: Any) -> Any:
        return torch.relu(a @ b) * 2.0

    g = torch.Generator().manual_seed(3)
    a, b = torch.rand(8, 16, generator=g), torch.rand(16, 8, generator=g)
    gm = make_fx(f)(a, b)
    lifted = capture.lift([n for n in gm.graph.nodes if n.op == "call_function"])
    return gm, lifted, [a, b]


def test_numeric_dump_tells_a_kernel_that_disagrees_with_its_mugraph(tmp_path: Path,
                                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    gm, lifted, xs = _partition()
    rec = capture.PartitionReport(0, 0, "forward", ["mm", "relu", "mul"])
    runner = capture.PartitionRunner(lifted, vm.compile(lifted.graph), capture.eager_module(gm, lifted), rec)
    want = list(runner.eager(*xs))
    assert runner.kernels(xs)[0].allclose(want[0], rtol=1e-5)  # the real kernels pass the check
    opts = capture.CaptureOptions(profile=False)
    dump = tmp_path / "numeric.jsonl"
    monkeypatch.setenv(capture.DUMP_ENV, str(dump))
    assert capture._check_runner(runner, xs, want, gm, lifted, opts, torch.device("cpu"), "p0") is None
    assert not dump.exists()
    real = runner.kernels

    def off(ys: Any) -> Any:  # a kernel that reads one element wrong (a view or an index bug)
        out = [y.clone() for y in real(ys)]
        out[0][3, 5] += 7.0
        return out

    monkeypatch.setattr(runner, "kernels", off)
    why = capture._check_runner(runner, xs, want, gm, lifted, opts, torch.device("cpu"), "p0")
    assert why is not None and why.startswith("numeric check failed: output 0")
    (line,) = [json.loads(x) for x in dump.read_text().splitlines()]
    assert line["partition"] == "p0" and "matmul" in line["graph"] and line["mugraph"]
    assert [i["shape"] for i in line["inputs"]] == [[8, 16], [16, 8]]
    (o,) = line["outputs"]
    assert not o["close"] and o["max_abs"] == pytest.approx(7.0, rel=1e-6)
    # the μGraph's float64 value agrees with the ATen ops' float64 reference; the kernels' result does not
    assert o["max_abs_aten_vs_mu64"] < 1e-4 and o["max_abs_kernel_vs_mu64"] > 6.9
    # the program itself (run again on the same inputs) agrees with its μGraph: the fault is in what the runner got
    (rel,) = line["program_vs_mu64_rel"]["tuned"]
    assert rel < 1e-6
    w = o["worst"][0]
    assert w["index"] == 3 * 8 + 5 and w["mu64"] == pytest.approx(w["ref64"], rel=1e-9)


def test_a_partition_whose_kernels_run_out_of_shared_memory_is_compiled_again_at_one_stage(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """Issue 20 (the H200 training run: ``OutOfResources: shared memory, Required: 245760`` sent partitions to the
    fallback): where Triton refuses a kernel's shared memory, the partition's check gets the runtime's retry (the
    kernel compiled again without pipelining, tiles and warps kept); the result is still checked."""
    from triton.runtime.errors import OutOfResources

    from verimirage.backend import runtime

    gm, lifted, xs = _partition()
    g = vm.Graph.parse(str(lifted.graph))
    prog = vm.compile(g)
    prog.launch = {k: {"num_warps": 4, "num_stages": 3} for k in prog.launch}  # as if pipelined
    rec = capture.PartitionReport(0, 0, "forward", ["mm", "relu", "mul"])
    runner = capture.PartitionRunner(lifted, prog, capture.eager_module(gm, lifted), rec)
    want = list(runner.eager(*xs))
    refused: list[int] = []

    def load(jit: Any, call: Any, grid: Any, launch: Any) -> None:  # Triton's compile and load, refusing 3 stages
        if launch["num_stages"] > 1:
            refused.append(launch["num_stages"])
            raise OutOfResources(245760, 232448, "shared memory")

    monkeypatch.setattr(runtime, "_load_kernel", load)
    opts = capture.CaptureOptions(profile=False)
    assert capture._check_runner(runner, xs, want, gm, lifted, opts, torch.device("cpu"), "p0") is None
    assert refused and runner.program is prog
    assert all(d["num_stages"] == 1 for d in prog.launch.values())
    # a kernel Triton refuses at one stage too: the failure is reported, the partition stays with the fallback
    def refuse(*args: Any) -> None:
        raise OutOfResources(1, 0, "shared memory")

    monkeypatch.setattr(runtime, "_load_kernel", refuse)
    runner.program = prog = vm.compile(g)
    why = capture._check_runner(runner, xs, want, gm, lifted, opts, torch.device("cpu"), "p0")
    assert why is not None and "OutOfResources" in why
