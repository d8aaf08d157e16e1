"""A kernel that only reshapes, row-major, a buffer the program wrote is not launched: its output is that buffer's
memory under the new shape (``ModuleSource.views``; issue 23: the layer's flatten of the attention output before
the o projection was a copy kernel of its own, 1.5 us and a launch on an H100)."""

from __future__ import annotations

import numpy as np
import pytest

import verimirage as vm
from verimirage.backend.codegen import _view_kernel, generate
from verimirage.ir.builders import BlockBuilder
from verimirage.ir.ops import TensorType


def _chain(shape: tuple[int, ...] = (2, 32), last: bool = False) -> vm.Graph:
    g = vm.Graph()
    x = g.input("X", (4, 16), vm.float16)
    y = g.reshape(g.exp(g.mul(x, x)), shape)
    g.output(y if last else g.add(y, y))
    return g


def _unfused(g: vm.Graph) -> vm.MuGraph:
    from verimirage.ir.graph import node_list

    mg = vm.MuGraph()
    vals: dict[int, object] = {}
    for i, n in enumerate(node_list(g)):
        if n.op == "input":
            vals[i] = mg.input(n.attr("name"), n.outs[0].shape, n.outs[0].dtype)
        else:
            vals[i] = mg.apply(n.op, [vals[a] for a, _ in n.args], n.attr_dict)
    mg.output(vals[len(node_list(g)) - 1])  # type: ignore[arg-type]
    return mg


def test_a_reshape_of_a_written_buffer_is_a_view_and_computes_the_same() -> None:
    g = _chain()
    ms = generate(_unfused(g))
    assert len(ms.views) == 1 and ms.views[0][1] == (2, 32)
    assert len(ms.steps) == 3  # mul, exp, add: the reshape is not launched
    assert ".view((2, 32))" in ms.source
    torch = pytest.importorskip("torch")
    rng = np.random.default_rng(3)
    x = rng.standard_normal((4, 16)).astype(np.float16).astype(np.float64) * 0.5
    (ref,) = vm.evaluate(g, {"X": x})
    got = vm.compile(_unfused(g))(X=torch.tensor(x, dtype=torch.float16)).double().numpy()
    assert got.shape == (2, 32) and np.linalg.norm(got - ref) / np.linalg.norm(ref) < 2e-3


def test_a_returned_reshape_or_one_of_an_input_is_still_a_kernel() -> None:
    assert generate(_unfused(_chain(last=True))).views == ()  # the program's output: its own buffer
    g = vm.Graph()
    x = g.input("X", (4, 16), vm.float16)
    g.output(g.exp(g.reshape(x, (2, 32))))  # an input: any strides, not the program's memory
    assert generate(_unfused(g)).views == ()


def test_a_block_graph_of_reshapes_that_moves_elements_is_not_a_view() -> None:
    # each block reshapes its row (1, 4) to a column (4, 1) and stores it as column b: a transpose, not a reshape
    t = TensorType((2, 4), vm.float16)
    b = BlockBuilder((2,), 1)
    b.output(b.reshape(b.input(0, t, (0,), None), (4, 1)), (1,))
    assert not _view_kernel(b.build(), t, TensorType((4, 2), vm.float16))
    # the same tiles stored row-major (block b writes rows 2b, 2b+1 of (4, 2)): a reshape
    b2 = BlockBuilder((2,), 1)
    b2.output(b2.reshape(b2.input(0, t, (0,), None), (2, 2)), (0,))
    assert _view_kernel(b2.build(), t, TensorType((4, 2), vm.float16))


@pytest.mark.parametrize("mode", ["start", "end"])
def test_pdl_kernels_wait_before_any_memory_access(mode: str) -> None:
    # programmatic dependent launch (opt-in, VERIMIRAGE_PDL): griddepcontrol.wait is the first statement after the
    # program ids and the L2 prefetches of the program's inputs (no value read: test_pdl_prefetch.py), so no load or
    # store runs before the previous kernel completed; launch_dependents first or last
    ms = generate(_unfused(_chain()), pdl=mode)
    assert ms.pdl == mode and "from triton.language.extra.cuda import gdc_launch_dependents, gdc_wait" in ms.source
    kernels = [k for k in ms.source.split("@triton.jit")[1:] if "tl.store(" in k]
    assert len(kernels) == len(ms.steps) == 3
    for k in kernels:
        lines = k.splitlines()[2:]
        lines = lines[:next((i for i, ln in enumerate(lines) if ln and not ln.startswith("    ")), len(lines))]
        body = [ln.strip() for ln in lines if ln.strip() and not ln.strip().startswith(('"""', "pid", "_vm_prefetch("))]
        assert body[0] == "gdc_wait()"
        first_mem = min(i for i, ln in enumerate(body) if "tl.load(" in ln or "tl.store(" in ln)
        dep = body.index("gdc_launch_dependents()")
        assert dep < first_mem if mode == "start" else dep == len(body) - 1 and "tl.store(" in body[dep - 1]
    off = generate(_unfused(_chain()))
    assert off.pdl == "" and "gdc_" not in off.source


def test_pdl_is_never_used_in_the_interpreter(monkeypatch: pytest.MonkeyPatch) -> None:
    from verimirage.backend import runtime

    monkeypatch.setenv("VERIMIRAGE_PDL", "1")
    monkeypatch.setattr(runtime, "interpreting", lambda: True)
    assert runtime._pdl_wanted() == ""
    monkeypatch.setattr(runtime, "interpreting", lambda: False)
    assert runtime._pdl_wanted() == "end"
    monkeypatch.setenv("VERIMIRAGE_PDL", "start")
    assert runtime._pdl_wanted() == "start"
    monkeypatch.setenv("VERIMIRAGE_PDL", "bogus")
    assert runtime._pdl_wanted() == ""


def test_pdl_auto_lets_a_small_next_kernel_launch_early() -> None:
    # "auto": launch_dependents at the start where the next launched kernel has at most PDL_EARLY_MAX_BLOCKS blocks
    # (its blocks' placement matters little), else after the stores; the last kernel: after its stores
    from verimirage.backend.codegen import PDL_EARLY_MAX_BLOCKS

    g = _chain()
    ms = generate(_unfused(g), pdl="auto")
    grids = [st.grid for st in ms.steps]
    kernels = [k for k in ms.source.split("@triton.jit")[1:] if "tl.store(" in k]
    for k, nxt in zip(kernels, [*grids[1:], None], strict=True):
        early = "gdc_wait()\n    gdc_launch_dependents()" in k
        small = nxt is not None and int(np.prod(nxt)) <= PDL_EARLY_MAX_BLOCKS
        assert early == small and k.count("gdc_launch_dependents()") == 1


@pytest.mark.gpu
@pytest.mark.parametrize("pdl", ["", "end", "auto", "start"])
def test_views_and_pdl_through_the_lean_path_and_a_cuda_graph(pdl: str, monkeypatch: pytest.MonkeyPatch) -> None:
    # the lean path's launch plans alias a view to its buffer (the C launcher's pointer slots, the Triton launchers'
    # pointer texts); with PDL the Triton launchers serve (the C launcher takes plain launches only)
    torch = pytest.importorskip("torch")
    monkeypatch.setenv("VERIMIRAGE_PDL", pdl)
    g = _chain()
    mg = _unfused(g)
    rng = np.random.default_rng(5)
    for graph in (False, True):
        fn = vm.compile(mg, cuda_graph=graph)
        assert fn.views and len(fn.steps) == 3
        for _ in range(3):  # fresh inputs each call: the plan (or the graph) must read them, not the first ones
            x = rng.standard_normal((4, 16)).astype(np.float16).astype(np.float64)
            (ref,) = vm.evaluate(g, {"X": x})
            got = fn(torch.tensor(x, dtype=torch.float16, device="cuda")).double().cpu().numpy()
            assert np.linalg.norm(got - ref) / np.linalg.norm(ref) < 2e-3
        if not graph:
            plan = next(iter(fn._plans.values()))
            assert plan.launcher == ("c" if not pdl else "triton")
