"""Count the Python work of a compiled program's call on the CPU, Triton's launcher mocked (issue 28).

    TRITON_INTERPRET=1 python benchmarks/eager_path_cpu.py [--names gqa ntrans ...] [--out FILE.json]

On a CPU-only machine kernels run in Triton's interpreter, whose cost says nothing about a GPU launch. This
script instead builds each suite program's lean launch plan (``verimirage.backend.runtime._LeanPlan``) with
Triton's ``JITFunction.run`` and compiled launcher replaced by a C no-op (``"".format``), so what a call costs
here is the Python around the launches: the signature check, output allocation, workspace, stream lookup.
Per call it records the **count** of Python function calls and C function calls (``sys.setprofile``
events; deterministic, unlike times on a shared machine) and the best-of-N wall time (indicative only), for:

* ``call``: ``prog(*xs)`` (fresh outputs), and ``call_out``: ``prog(*xs, out=outs)`` (caller's outputs), through
  the program-wide C launcher (its plan made by the real extension, its launch call the C no-op);
* ``call_triton_launchers``: ``prog(*xs)`` with Triton's launcher called per kernel (``VERIMIRAGE_LAUNCHER=triton``);
* ``checked``: the same call through the checked path (``_bind`` + the generated ``forward``, launches
  recorded by the mocked ``JITFunction.run``) — what every call paid before the lean path;
* the pieces: one ``torch.empty``-class allocation (``new_empty``) and one ``torch.add`` on these CPU tensors.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import timeit
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import torch

import verimirage as vm
from verimirage.backend import runtime
from verimirage.benchmarks.designs import expert, small_design_kw

TORCH = {vm.float16: torch.float16, vm.bfloat16: torch.bfloat16, vm.float32: torch.float32}
NAMES = ["gqa", "mha", "mqa", "qknorm_gqa", "gqa_stable", "mha_stable", "rmsnorm_linear", "lora", "gated_mlp",
         "ntrans"]


class _Launcher:
    global_scratch_size = 0
    profile_scratch_size = 0
    launch_cooperative_grid = False
    launch_pdl = False
    launch = "".format  # a C function that takes any arguments and does nothing with them


class _Kernel:
    function, packed_metadata, run = 0, (4, 1, 0), _Launcher()
    src: Any = None
    metadata: Any = None


def _mock(prog: Any) -> None:
    """Replace Triton's launches (and the CUDA-only pieces the lean path reads) by no-ops on CPU tensors. The
    program-wide C launcher's plan is the real one (made without the driver's layout check); its launch call is
    the C no-op too."""
    from types import SimpleNamespace

    from verimirage.backend import launch

    for k in prog.kernels:
        sig = prog.module.SIGNATURES[k.name]

        def run(*a: Any, grid: Any, warmup: bool, _sig: dict[str, str] = sig, **kw: Any) -> Any:
            kern = _Kernel()
            kern.src = SimpleNamespace(signature={n: "constexpr" if isinstance(v, int) and v == 1 else t
                                                  for (n, t), v in zip(_sig.items(), a, strict=True)})
            kern.metadata = SimpleNamespace(num_ctas=1)
            return kern

        getattr(prog.module, k.name).run = run
    real = launch.module()
    if real is not None:
        launch.module = lambda: SimpleNamespace(  # type: ignore[assignment]
            make=lambda dev, n, entries, check: real.make(dev, n, entries, False), launch="".format)
    held: dict[int, torch.Tensor] = {}

    def alloc(n: int, stream: int) -> int:
        t = torch.empty(n, dtype=torch.uint8)
        held[t.data_ptr()] = t
        return t.data_ptr()

    runtime._raw_allocator = lambda: (alloc, held.pop)  # type: ignore[assignment]
    runtime._device_getter = lambda: (lambda: -1)  # CPU tensors: get_device() == -1
    runtime._stream_getter = lambda: (lambda dev: 0)
    if hasattr(runtime, "_capture_checker"):
        runtime._capture_checker = lambda: (lambda: False)  # type: ignore[attr-defined]
    prog.lean = True


def count(fn: Any) -> dict[str, int]:
    """Python function calls and C function calls during one ``fn()``."""
    n = {"py_calls": 0, "c_calls": 0}

    def prof(frame: Any, event: str, arg: Any) -> None:
        if event == "call":
            n["py_calls"] += 1
        elif event == "c_call":
            n["c_calls"] += 1

    sys.setprofile(prof)
    try:
        fn()
    finally:
        sys.setprofile(None)
    n["py_calls"] -= 1  # fn itself
    n["c_calls"] -= 1  # sys.setprofile(None)
    return n


def best_us(fn: Any, number: int = 2000, repeat: int = 7) -> float:
    return min(timeit.repeat(fn, number=number, repeat=repeat)) / number * 1e6


def measure(name: str) -> dict[str, Any]:
    g = vm.benchmarks.get(name, small=True)
    prog = vm.compile(expert(name, g, **small_design_kw(name)))
    _mock(prog)
    gen = torch.Generator().manual_seed(0)
    xs = [(0.3 * torch.randn(t.shape, generator=gen)).to(TORCH[t.dtype]) for t in g.inputs]
    first = prog(*xs)
    outs = tuple(torch.empty_like(o) for o in (first if isinstance(first, tuple) else (first,)))
    out = outs[0] if len(outs) == 1 else outs
    row: dict[str, Any] = {"name": name, "inputs": len(xs), "kernels": len(prog.kernels)}
    prog(*xs)
    row["launcher"] = next(iter(prog._plans.values())).launcher
    row["call"] = count(lambda: prog(*xs)) | {"us": best_us(lambda: prog(*xs))}
    os.environ["VERIMIRAGE_LAUNCHER"] = "triton"  # the same lean path with Triton's launcher per kernel
    try:
        tri = vm.compile(prog.mugraph)
        _mock(tri)
        tri(*xs)
        tri(*xs)
    finally:
        del os.environ["VERIMIRAGE_LAUNCHER"]
    row["call_triton_launchers"] = count(lambda: tri(*xs)) | {"us": best_us(lambda: tri(*xs))}
    try:
        prog(*xs, out=out)
        row["call_out"] = count(lambda: prog(*xs, out=out)) | {"us": best_us(lambda: prog(*xs, out=out))}
    except TypeError:  # a runtime without out=
        pass
    checked = vm.compile(prog.mugraph)
    _mock(checked)
    checked.lean = False
    checked(*xs)
    row["checked"] = count(lambda: checked(*xs)) | {"us": best_us(lambda: checked(*xs), number=500)}
    e = torch.empty(0, dtype=xs[0].dtype)
    row["new_empty_us"] = best_us(lambda: e.new_empty((16, 32)))
    row["torch_add_us"] = best_us(lambda: torch.add(xs[0], xs[0]))
    return row


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--names", nargs="*", default=NAMES)
    ap.add_argument("--out", type=Path, default=None)
    args = ap.parse_args()
    runtime.ensure_mode()
    rows = [measure(n) for n in args.names]
    for r in rows:
        parts = [f"{r['name']}: {r['inputs']} inputs, {r['kernels']} kernel(s)"]
        for k in ("call", "call_out", "call_triton_launchers", "checked"):
            if k in r:
                parts.append(f"{k} {r[k]['py_calls']} py + {r[k]['c_calls']} C calls, {r[k]['us']:.2f} µs")
        parts.append(f"new_empty {r['new_empty_us']:.2f} µs, torch.add {r['torch_add_us']:.2f} µs")
        print("; ".join(parts))
    if args.out:
        args.out.write_text(json.dumps({"torch": torch.__version__, "rows": rows}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
