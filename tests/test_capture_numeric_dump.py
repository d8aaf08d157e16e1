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
    fallback): where Triton refuses a kernel's shared memory, the partition's check compiles the same kernels again
    without pipelining (tiles and warps kept) before giving up on them; the result is still checked."""
    gm, lifted, xs = _partition()
    g = vm.Graph.parse(str(lifted.graph))
    prog = vm.compile(g)
    prog.launch = {k: {"num_warps": 4, "num_stages": 3} for k in prog.launch}  # as if pipelined
    rec = capture.PartitionReport(0, 0, "forward", ["mm", "relu", "mul"])
    runner = capture.PartitionRunner(lifted, prog, capture.eager_module(gm, lifted), rec)
    want = list(runner.eager(*xs))

    class OutOfResources(Exception):
        pass

    real = capture.PartitionRunner.kernels
    calls: list[Any] = []

    def kernels(self: Any, ys: Any) -> Any:
        calls.append(self.program)
        if self.program is prog:
            raise OutOfResources("out of resource: shared memory, Required: 245760, Hardware limit: 232448")
        return real(self, ys)

    monkeypatch.setattr(capture.PartitionRunner, "kernels", kernels)
    opts = capture.CaptureOptions(profile=False)
    assert capture._check_runner(runner, xs, want, gm, lifted, opts, torch.device("cpu"), "p0") is None
    assert len(calls) == 2 and runner.program is not prog
    assert all(d["num_stages"] == 1 for d in runner.program.launch.values())
    # a program already at one stage has nothing smaller to try: the failure is reported
    runner.program = prog
    prog.launch = {k: {"num_warps": 4, "num_stages": 1} for k in prog.launch}
    why = capture._check_runner(runner, xs, want, gm, lifted, opts, torch.device("cpu"), "p0")
    assert why is not None and "OutOfResources" in why
