"""The lean launch path and the CUDA-graph option of compiled programs (issue 28).

On the CPU the kernels run in Triton's interpreter, where calls take the checked path; the lean path's
plan (which kernel, grid, integer arguments and pointers each launch gets) is checked here against the
generated ``forward`` with Triton's launcher replaced by a recorder. On a GPU (``@pytest.mark.gpu``) the
lean path and ``cuda_graph=True`` run for real against ``forward`` and the float64 reference.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
import torch

import verimirage as vm
from verimirage.backend import runtime
from verimirage.backend.runtime import CompiledProgram, ensure_mode
from verimirage.benchmarks.designs import expert, small_design_kw

ensure_mode()

TORCH = {vm.float16: torch.float16, vm.bfloat16: torch.bfloat16, vm.float32: torch.float32}


def inputs_for(g: vm.Graph, seed: int = 0, device: str = "cpu") -> list[torch.Tensor]:
    gen = torch.Generator().manual_seed(seed)
    return [(0.3 * torch.randn(t.shape, generator=gen)).to(TORCH[t.dtype]).to(device) for t in g.inputs]


def program(name: str) -> tuple[vm.Graph, CompiledProgram]:
    g = vm.benchmarks.get(name, small=True)
    return g, vm.compile(expert(name, g, **small_design_kw(name)))


class _Recorder:
    """Stands in for Triton on a CPU: ``JITFunction.run`` and the compiled launcher record their launches."""

    def __init__(self, prog: CompiledProgram, monkeypatch: pytest.MonkeyPatch) -> None:
        self.launches: list[tuple[str, str, tuple[int, int, int], list[Any]]] = []
        rec = self

        class Launcher:
            global_scratch_size = 0
            profile_scratch_size = 0
            launch_cooperative_grid = False
            launch_pdl = False

            def launch(self, gx: int, gy: int, gz: int, stream: int, function: str, coop: bool, pdl: bool,
                       gs: Any, ps: Any, meta: Any, lm: Any, eh: Any, xh: Any, *args: Any) -> None:
                assert (stream, coop, pdl, gs, ps, lm, eh, xh) == (rec.stream, False, False, None, None, None, None,
                                                                   None)
                rec.launches.append(("lean", function, (gx, gy, gz), list(args)))

        class Kernel:
            def __init__(self, name: str) -> None:
                self.function, self.packed_metadata, self.run = name, (4, 1, 0), Launcher()

        for k in prog.kernels:
            def run(*args: Any, grid: tuple[int, ...], warmup: bool, _name: str = k.name, **kw: Any) -> Kernel:
                assert not warmup and kw == prog.launch[_name]
                g3 = (*grid, 1, 1)
                ptrs = [a.data_ptr() if isinstance(a, torch.Tensor) else a for a in args]
                rec.launches.append(("jit", _name, (g3[0], g3[1], g3[2]), ptrs))
                return Kernel(_name)

            monkeypatch.setattr(getattr(prog.module, k.name), "run", run)
        monkeypatch.setattr(runtime, "_device_getter", lambda: (lambda: -1))  # CPU tensors: get_device() == -1
        self.stream = 0  # the "current stream" handle the lean path reads
        self.capturing = False  # whether that stream "is capturing a CUDA graph"
        monkeypatch.setattr(runtime, "_stream_getter", lambda: (lambda dev: rec.stream))
        monkeypatch.setattr(runtime, "_capture_checker", lambda: (lambda: rec.capturing))
        self.held: dict[int, torch.Tensor] = {}  # the workspace "allocator": CPU buffers by address
        self.allocs = 0

        def alloc(nbytes: int, stream: int) -> int:
            assert stream == rec.stream
            t = torch.empty(nbytes, dtype=torch.uint8)
            self.held[t.data_ptr()] = t
            self.allocs += 1
            return t.data_ptr()

        monkeypatch.setattr(runtime, "_raw_allocator", lambda: (alloc, lambda ptr: self.held.pop(ptr)))
        prog.lean = True


#: These tests replace Triton's launcher with a recorder or rely on the interpreter (TRITON_INTERPRET=1, how the
#: CPU runs kernels); on a GPU machine the same behaviour is covered by the tests marked gpu below.
cpu_only = pytest.mark.skipif(torch.cuda.is_available(), reason="CPU-only (interpreter) behaviour")


def _pointer_positions(prog: CompiledProgram, kernel: str) -> list[int]:
    """Positions of the tensor pointers in ``kernel``'s launch arguments (each tensor: its pointer, then one
    stride per dim)."""
    step = next(s for s in prog.steps if s.kernel == kernel)
    positions: list[int] = []
    i = 0
    for _, rank in (*step.args, *((None, len(shape)) for _, shape, _ in step.outs)):
        positions.append(i)
        i += 1 + rank
    return positions


@cpu_only
@pytest.mark.parametrize("name", ["gqa", "ntrans"])
def test_lean_plan_replays_the_generated_launches(name: str, monkeypatch: pytest.MonkeyPatch) -> None:
    g, prog = program(name)
    rec = _Recorder(prog, monkeypatch)
    xs = inputs_for(g)
    first = prog(*xs)  # makes the plan through JITFunction.run
    second = prog(*xs)  # the lean runner
    assert prog._fast is not None and len(prog._plans) == 1
    by_name = prog(**dict(zip(prog.input_names, xs, strict=True)))  # by name: the lean runner too
    assert len(prog._plans) == 1 and [r[0] for r in rec.launches].count("lean") == 2 * len(prog.kernels)
    assert [tuple(o.shape) for o in (by_name if isinstance(by_name, tuple) else (by_name,))] == [
        tuple(o.shape) for o in (second if isinstance(second, tuple) else (second,))]
    rec.launches = [r for r in rec.launches[: 2 * len(prog.kernels)]]
    jit = [r for r in rec.launches if r[0] == "jit"]
    lean = [r for r in rec.launches if r[0] == "lean"]
    assert len(jit) == len(lean) == len(prog.kernels) >= 1
    firsts = first if isinstance(first, tuple) else (first,)
    seconds = second if isinstance(second, tuple) else (second,)
    assert [tuple(o.shape) for o in firsts] == [tuple(o.shape) for o in seconds]
    assert [o.dtype for o in firsts] == [o.dtype for o in seconds]
    # same kernels, grids and integer arguments; pointers map one to one (inputs to themselves, the
    # returned outputs to the returned outputs, intermediates to distinct workspace addresses)
    mapping: dict[int, int] = {x.data_ptr(): x.data_ptr() for x in xs}
    mapping.update({a.data_ptr(): b.data_ptr() for a, b in zip(firsts, seconds, strict=True)})
    for (_, k1, g1, a1), (_, k2, g2, a2) in zip(jit, lean, strict=True):
        assert k1 == k2 and g1 == g2 and len(a1) == len(a2)
        positions = _pointer_positions(prog, k1)
        for j, (x, y) in enumerate(zip(a1, a2, strict=True)):
            if j in positions:
                assert mapping.setdefault(x, y) == y, f"{k1}: pointer argument {j} maps inconsistently"
            else:
                assert x == y, f"{k1}: integer argument {j} differs"
    assert len(set(mapping.values())) == len(mapping)
    assert not rec.held  # every workspace given back
    # the integer arguments are the strides of what forward passes
    for (_, kname, _, a1) in jit:
        step = next(s for s in prog.steps if s.kernel == kname)
        assert len(a1) == sum(1 + r for _, r in step.args) + sum(1 + len(sh) for _, sh, _ in step.outs)


def _c_launcher_recorder(prog: CompiledProgram, rec: _Recorder, monkeypatch: pytest.MonkeyPatch) -> list[Any]:
    """Let the lean plan take the program-wide C launcher (:mod:`verimirage.backend.launch`) on the CPU: the fake
    kernels get Triton's signature (an integer 1 specialised away as a constexpr) and a function handle, the plan
    is made by the real C extension (without the driver's layout check) and each call records, per kernel, the
    parameter values the C side would pass to ``cuLaunchKernel``."""
    from types import SimpleNamespace

    from verimirage.backend import launch

    real = launch.module()
    if real is None:
        pytest.skip("no C compiler for the launcher here")
    names = [k.name for k in prog.kernels]
    entries: list[Any] = []
    for k in prog.kernels:
        orig = getattr(prog.module, k.name).run

        def run(*args: Any, _orig: Any = orig, _name: str = k.name, **kw: Any) -> Any:
            kern = _orig(*args, **kw)
            sig = prog.module.SIGNATURES[_name]
            kern.src = SimpleNamespace(signature={n: "constexpr" if isinstance(a, int) and a == 1 else t
                                                  for (n, t), a in zip(sig.items(), args, strict=True)})
            kern.metadata = SimpleNamespace(num_ctas=1)
            kern.function = 1000 + names.index(_name)
            return kern

        monkeypatch.setattr(getattr(prog.module, k.name), "run", run)
    calls: list[Any] = []

    def make(device: int, nsrc: int, ents: list[Any], check: bool) -> Any:
        entries[:] = ents
        return real.make(device, nsrc, ents, False)

    def record(plan: Any, stream: int, *ptrs: int) -> None:
        assert stream == rec.stream
        for e, params in zip(entries, real.params(plan, stream, *ptrs), strict=True):
            rec.launches.append(("lean", names[e[0] - 1000], e[1:4], params[:-2]))
            assert params[-2:] == [0, 0]  # no scratch buffers
        calls.append(ptrs)

    monkeypatch.setattr(launch, "module", lambda: SimpleNamespace(make=make, launch=record, params=real.params))
    return calls


@cpu_only
@pytest.mark.parametrize("name", ["gqa", "ntrans"])
def test_c_launcher_passes_what_triton_would(name: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """The program-wide C launcher: one C call per program call, and each kernel gets the parameters Triton's
    launch would pass (pointers remapped to this call's buffers, the integers not specialised away)."""
    g, prog = program(name)
    rec = _Recorder(prog, monkeypatch)
    calls = _c_launcher_recorder(prog, rec, monkeypatch)
    xs = inputs_for(g)
    first = prog(*xs)
    plan = next(iter(prog._plans.values()))
    assert plan.launcher == "c" and "LAUNCH(PLAN" in plan.source and "L0(" not in plan.source
    second = prog(*xs)
    assert len(calls) == 1
    jit = [r for r in rec.launches if r[0] == "jit"]
    lean = [r for r in rec.launches if r[0] == "lean"]
    assert len(jit) == len(lean) == len(prog.kernels)
    firsts = first if isinstance(first, tuple) else (first,)
    seconds = second if isinstance(second, tuple) else (second,)
    mapping: dict[int, int] = {x.data_ptr(): x.data_ptr() for x in xs}
    mapping.update({a.data_ptr(): b.data_ptr() for a, b in zip(firsts, seconds, strict=True)})
    for (_, k1, g1, a1), (_, k2, g2, a2) in zip(jit, lean, strict=True):
        assert k1 == k2 and g1 == tuple(g2)
        positions = _pointer_positions(prog, k1)
        want = [a for j, a in enumerate(a1) if j in positions or a != 1]  # Triton drops the 1s (constexpr)
        ptr_at = [j for j, a in enumerate(a1) if j in positions or a != 1]
        assert len(want) == len(a2)
        for j, x, y in zip(ptr_at, want, a2, strict=True):
            if j in positions:
                assert mapping.setdefault(x, y) == y, f"{k1}: pointer argument {j} maps inconsistently"
            else:
                assert x == y, f"{k1}: integer argument {j} differs"
    assert len(set(mapping.values())) == len(mapping)
    # out=: the same single C call, writing into the caller's tensors
    out = tuple(torch.empty_like(o) for o in firsts)
    rec.launches.clear()
    assert prog(*xs, out=out if len(out) > 1 else out[0]) is not None and len(calls) == 2
    assert out[-1].data_ptr() in rec.launches[-1][3]


@cpu_only
@pytest.mark.parametrize("template_bytes", [0, 1 << 18])
def test_lean_outputs_are_fresh_tensors(template_bytes: int, monkeypatch: pytest.MonkeyPatch) -> None:
    """Each plain call returns new output tensors: from ``empty_like`` of a kept template (small outputs) or
    ``new_empty`` (outputs over the template size), never a buffer an earlier call returned."""
    monkeypatch.setattr(runtime, "_TEMPLATE_BYTES", template_bytes)
    g, prog = program("ntrans")
    _Recorder(prog, monkeypatch)
    xs = inputs_for(g)
    held = [prog(*xs) for _ in range(3)]
    plan = next(iter(prog._plans.values()))
    assert ("empty_like(T" in plan.source) == (template_bytes > 0)
    assert ("new_empty(" in plan.source) == (template_bytes == 0)
    ptrs = [o.data_ptr() for outs in held for o in outs]
    assert len(set(ptrs)) == len(ptrs)
    for outs in held:
        for o, t in zip(outs, prog.output_types, strict=True):
            assert tuple(o.shape) == t.shape and o.is_contiguous()


@cpu_only
def test_lean_path_rejects_wrong_inputs_with_the_same_messages(monkeypatch: pytest.MonkeyPatch) -> None:
    g, prog = program("ntrans")
    _Recorder(prog, monkeypatch)
    xs = inputs_for(g)
    prog(*xs)
    assert prog._fast is not None
    X, H, alpha = xs
    with pytest.raises(ValueError, match=r"'X': shape \(8, 32\); expected \(8, 64\)"):
        prog(X[:, :32], H, alpha)
    with pytest.raises(TypeError, match=r"'H': dtype torch.float32; expected torch.float16"):
        prog(X, H.float(), alpha)
    with pytest.raises(TypeError, match=r"expected a torch\.Tensor"):
        prog(X.numpy(), H, alpha)
    with pytest.raises(TypeError, match=r"missing input\(s\) \['alpha'\]"):
        prog(X, H)
    with pytest.raises(TypeError, match=r"takes 3 input\(s\)"):
        prog(X, H, alpha, alpha)
    with pytest.raises(TypeError, match="unknown input 'Y'"):
        prog(X=X, H=H, Y=alpha)
    with pytest.raises(ValueError, match=r"'X': shape \(8, 32\); expected \(8, 64\)"):
        prog(X=X[:, :32], H=H, alpha=alpha)
    # (the device check needs a GPU: here the recorder's device index is the CPU's; see the gpu test below)
    # other strides or a misaligned data pointer are another specialisation: a second plan, not an error
    n = len(prog._plans)
    prog(X.t().contiguous().t(), H, alpha)
    assert len(prog._plans) == n + 1
    buf = torch.empty(X.numel() + 1, dtype=X.dtype)[1:].view(X.shape)
    buf.copy_(X)
    prog(buf, H, alpha)
    assert len(prog._plans) == n + 2


@cpu_only
def test_lean_path_writes_into_out_tensors(monkeypatch: pytest.MonkeyPatch) -> None:
    """``out=``: the kernels write into the caller's tensors when they fit the plan (no allocation), else the
    checked path computes fresh outputs and copies them over; wrong out tensors get clear errors."""
    g, prog = program("gqa")
    rec = _Recorder(prog, monkeypatch)
    xs = inputs_for(g)
    first = prog(*xs)
    assert prog._fast_out is not None
    out = torch.empty_like(first)
    v = out._version
    rec.launches.clear()
    assert prog(*xs, out=out) is out
    assert out._version > v  # the write is visible to autograd's version check, as an in-place op's
    last = rec.launches[-1]
    assert last[0] == "lean" and out.data_ptr() in last[3]  # the last kernel writes the output into out
    # by name too; a one-element tuple is accepted too (through the checked path)
    rec.launches.clear()
    assert prog(out=out, **dict(zip(prog.input_names, xs, strict=True))) is out
    assert out.data_ptr() in rec.launches[-1][3]
    assert prog(*xs, out=(out,))[0] is out
    # out tensors the plan cannot write directly (another layout, misaligned, overlapping an input): the checked
    # path computes into a fresh output and copies it into out
    for bad in (torch.empty(first.shape[::-1], dtype=first.dtype).permute(2, 1, 0),
                torch.empty(first.numel() + 1, dtype=first.dtype)[1:].view(first.shape)):
        rec.launches.clear()
        assert prog(*xs, out=bad) is bad
        assert [r[0] for r in rec.launches] == ["lean"] * len(prog.kernels)
        assert bad.data_ptr() not in rec.launches[-1][3]
    # an out tensor that requires grad: PyTorch's rule for in-place writes (refused, except under no_grad)
    leaf = torch.empty_like(first).requires_grad_()
    with pytest.raises(RuntimeError, match="requires grad"):
        prog(*xs, out=leaf)
    with torch.no_grad():
        assert prog(*xs, out=leaf) is leaf
    # wrong out tensors: clear errors
    with pytest.raises(ValueError, match=r"out\[0\]: shape \(2, 32, 8\); expected \(2, 32, 16\)"):
        prog(*xs, out=out[..., :8])
    with pytest.raises(TypeError, match=r"out\[0\]: dtype torch.float32; expected torch.float16"):
        prog(*xs, out=out.float())
    with pytest.raises(TypeError, match=r"out: 2 tensor\(s\); this program has 1 output\(s\)"):
        prog(*xs, out=(out, out))
    with pytest.raises(TypeError, match=r"out: expected a torch.Tensor or a tuple of 1; got ndarray"):
        prog(*xs, out=out.numpy())
    with pytest.raises(ValueError, match=r"'Q': shape"):  # the inputs are still checked first
        prog(xs[0][..., :8], *xs[1:], out=out)


@cpu_only
def test_lean_path_keeps_one_workspace_per_stream(monkeypatch: pytest.MonkeyPatch) -> None:
    """A program with intermediate values: its workspace is kept for the first stream, allocated afresh (and
    given back) on another stream or while a CUDA graph is being captured."""
    g, prog = program("gqa")
    rec = _Recorder(prog, monkeypatch)
    xs = inputs_for(g)
    prog(*xs)  # the plan
    plan = next(iter(prog._plans.values()))
    assert "ws_alloc" in plan.source
    prog(*xs)  # keeps a workspace for stream 0
    kept = plan.kept_workspace[1]
    assert plan.kept_workspace[0] == 0 and kept
    rec.launches.clear()
    prog(*xs)
    prog(*xs, out=torch.empty_like(prog(*xs)))
    assert rec.allocs == 0 and all(kept in r[3] for r in rec.launches if r[1] == prog.kernels[0].name)
    rec.stream = 7  # another stream: a fresh workspace from the allocator each call, given back
    rec.launches.clear()
    prog(*xs)
    assert rec.allocs == 1 and not rec.held and kept not in rec.launches[0][3]
    rec.stream, rec.capturing = 0, True  # capturing on the kept stream: not the kept buffer either
    rec.launches.clear()
    prog(*xs)
    assert rec.allocs == 2 and not rec.held and kept not in rec.launches[0][3]


@cpu_only
def test_interpreter_calls_write_out_tensors() -> None:
    """``out=`` on the checked path (the interpreter), a two-output program: the results land in the caller's
    tensors; overlapping out tensors are refused."""
    g, prog = program("ntrans")
    xs = inputs_for(g)
    want = prog(*xs)
    assert isinstance(want, tuple) and len(want) == 2
    out = [torch.full_like(w, float("nan")) for w in want]
    assert prog(*xs, out=out) is out
    for o, w in zip(out, want, strict=True):
        torch.testing.assert_close(o, w, rtol=0, atol=0)
    buf = torch.empty(want[0].numel() + 64, dtype=want[0].dtype)
    with pytest.raises(ValueError, match=r"out\[0\] and out\[1\] overlap in memory"):
        prog(*xs, out=(buf[: want[0].numel()].view(want[0].shape), buf[64:].view(want[1].shape)))
    with pytest.raises(TypeError, match=r"out\[1\]: expected a torch.Tensor, got int"):
        prog(*xs, out=(out[0], 3))


@cpu_only
def test_interpreter_calls_take_the_checked_path() -> None:
    g, prog = program("gqa")
    assert not prog.lean  # the interpreter: the generated forward, every call
    xs = inputs_for(g)
    out = prog(*xs)
    ref = vm.evaluate(g, dict(zip(g.input_names(), xs, strict=True)))[0]
    np.testing.assert_allclose(out.double().numpy(), ref, atol=2e-2 * np.abs(ref).max())
    assert prog._fast is None and not prog._plans


@cpu_only
def test_cuda_graph_option_is_checked() -> None:
    g = vm.benchmarks.get("lora", small=True)
    mg = expert("lora", g, **small_design_kw("lora"))
    with pytest.raises(TypeError, match="cuda_graph='yes'; expected True or False"):
        vm.compile(mg, cuda_graph="yes")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="cuda_graph=True needs a CUDA device"):
        vm.compile(mg, cuda_graph=True)


@pytest.mark.gpu
@pytest.mark.parametrize("name", ["gqa", "ntrans", "rmsnorm_linear"])
def test_lean_path_on_the_gpu(name: str) -> None:
    g, prog = program(name)
    old = vm.compile(prog.mugraph)
    old.lean = False
    xs = inputs_for(g, device="cuda")
    ref = vm.evaluate(g, dict(zip(g.input_names(), [x.cpu() for x in xs], strict=True)))
    for _ in range(3):
        out, want = prog(*xs), old(*xs)
        outs = out if isinstance(out, tuple) else (out,)
        wants = want if isinstance(want, tuple) else (want,)
        for o, w, r in zip(outs, wants, ref, strict=True):
            assert torch.equal(o, w)
            np.testing.assert_allclose(o.double().cpu().numpy(), r, atol=2e-2 * max(np.abs(r).max(), 1e-3))
    assert prog._fast is not None and len(prog._plans) == 1
    plan = next(iter(prog._plans.values()))
    assert plan.launcher == "c" and plan.guard is not None  # one C launch call, the C signature check
    # from another thread (no CUDA context current there until the launcher makes the device's primary one so)
    import threading

    got: list[Any] = []
    t = threading.Thread(target=lambda: got.append(prog(*xs)))
    t.start()
    t.join()
    for o, w in zip(got[0] if isinstance(got[0], tuple) else (got[0],), outs, strict=True):
        assert torch.equal(o, w)
    # out=: into the caller's tensors (the fast path), and into misaligned ones (computed, then copied)
    bufs = [torch.full_like(o, float("nan")) for o in outs]
    odd = [torch.empty(o.numel() + 1, dtype=o.dtype, device="cuda")[1:].view(o.shape) for o in outs]
    for b in (bufs, odd):
        arg = b[0] if len(b) == 1 else tuple(b)
        assert prog(*xs, out=arg) is arg
        for o, w in zip(b, outs, strict=True):
            assert torch.equal(o, w)
    with pytest.raises(ValueError, match=r"out\[0\]: on cpu, but the inputs are on cuda:0"):
        prog(*xs, out=outs[0].cpu() if len(outs) == 1 else tuple(o.cpu() for o in outs))
    # wrong inputs: the same messages as the checked path
    names = g.input_names()
    bad_dtype = [xs[0].float(), *xs[1:]]
    with pytest.raises(TypeError, match=rf"'{names[0]}': dtype torch.float32; expected torch.float16"):
        prog(*bad_dtype)
    bad_shape = [xs[0][..., :1], *xs[1:]]
    with pytest.raises(ValueError, match=rf"'{names[0]}': shape"):
        prog(*bad_shape)
    with pytest.raises(ValueError, match=rf"'{names[0]}': on cpu, but earlier inputs are on cuda:0|"
                                         rf"'{names[1]}': on cuda:0, but earlier inputs are on cpu"):
        prog(xs[0].cpu(), *xs[1:])
    with pytest.raises(ValueError, match="compiled Triton kernels need CUDA tensors"):
        prog(*[x.cpu() for x in xs])
    # another layout and a misaligned pointer: new specialisations, same results
    x0 = torch.empty(xs[0].numel() + 1, dtype=xs[0].dtype, device="cuda")[1:].view(xs[0].shape)
    x0.copy_(xs[0])
    again = prog(x0, *xs[1:])
    for o, w in zip(again if isinstance(again, tuple) else (again,), outs, strict=True):
        torch.testing.assert_close(o, w)
    assert len(prog._plans) == 2


@pytest.mark.gpu
def test_cuda_graph_program_on_the_gpu() -> None:
    g = vm.benchmarks.get("gqa", small=True)
    mg = expert("gqa", g, **small_design_kw("gqa"))
    plain, graphed = vm.compile(mg), vm.compile(mg, cuda_graph=True)
    xs = inputs_for(g, device="cuda")
    a = graphed(*xs)
    torch.testing.assert_close(a, plain(*xs), rtol=0, atol=0)
    ys = inputs_for(g, seed=1, device="cuda")
    b = graphed(*ys)
    assert b is a  # the static output buffer: overwritten by every call
    torch.testing.assert_close(b, plain(*ys), rtol=0, atol=0)
    # inputs that are the static buffers are not copied
    for s, y in zip(graphed.static_inputs, xs, strict=True):
        s.copy_(y)
    torch.testing.assert_close(graphed(*graphed.static_inputs), plain(*xs), rtol=0, atol=0)
    with pytest.raises(TypeError, match=r"dtype torch.float32; expected torch.float16"):
        graphed(xs[0].float(), *xs[1:])


class _GatedMLP(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        gen = torch.Generator().manual_seed(0)
        self.w1 = torch.nn.Parameter(torch.randn(32, 32, generator=gen) / 6)
        self.w2 = torch.nn.Parameter(torch.randn(32, 32, generator=gen) / 6)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.nn.functional.silu(x @ self.w1) * (x @ self.w2)


@pytest.mark.slow
@pytest.mark.parametrize("mode", [None, "reduce-overhead"])
def test_torch_compile_backend_modes(mode: str | None, monkeypatch: pytest.MonkeyPatch) -> None:
    """``mode="reduce-overhead"`` reaches the backend: on a GPU each partition is a CUDA graph whose outputs are
    copied out (a second call must not overwrite the first call's result); in the interpreter no graphs.
    The search is replaced by the partition's own graph (every op its own kernel), so no egglog is needed."""
    from types import SimpleNamespace

    from verimirage.integrations.dynamo import verimirage_backend

    monkeypatch.setitem(vm.__dict__, "superoptimize", lambda g, **kw: SimpleNamespace(candidates=[g], best=g))
    cuda = torch.cuda.is_available()
    dev, dt, tol = ("cuda", torch.float16, 2e-2) if cuda else ("cpu", torch.float32, 1e-4)
    m = _GatedMLP().to(dev, dt)
    gen = torch.Generator().manual_seed(1)
    x1, x2 = (torch.randn(16, 32, generator=gen).to(dev, dt) for _ in range(2))
    with torch.no_grad():
        torch._dynamo.reset()
        cm = torch.compile(m, backend="verimirage", mode=mode)
        got1 = cm(x1)
        got2 = cm(x2)
        for got, x in ((got1, x1), (got2, x2)):
            torch.testing.assert_close(got, m(x), rtol=tol, atol=tol)
        torch._dynamo.reset()
        with pytest.raises(ValueError, match="mode='fastest'; expected one of"):
            verimirage_backend(torch.fx.symbolic_trace(m), [x1], mode="fastest")
