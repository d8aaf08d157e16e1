"""Ahead-of-time compilation of generated kernels for a GPU target, without a GPU.

The Triton interpreter accepts programs the GPU compiler rejects (``tl.dot``
below 16, some layouts), so every generated kernel is also compiled for sm_90
with ``triton.compile(ASTSource(fn, signature, constexprs), target=GPUTarget("cuda", 90, 32))``.
This runs in a *separate process* (:func:`compile_modules`), with the
interpreter off: after interpreted kernels ran in a process, compiling there
can fail spuriously. The report per kernel says whether the PTX uses ``wgmma``
(Hopper tensor cores) or ``mma`` instructions.

Run as ``python -m verimirage.backend.gpucompile MODULE.py ...``; prints JSON.
"""

from __future__ import annotations

import importlib.util
import json
import os
import re
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any


def compile_modules(paths: Sequence[Path | str], *, arch: int = 90, timeout_s: float = 600.0) -> dict[str, Any]:
    """Compile every kernel of the generated modules at ``paths`` for sm_``arch`` in a subprocess.

    Each kernel is compiled twice: unspecialised, and specialised as Triton's JIT does for contiguous,
    16-aligned tensors (:func:`specialize`). Returns ``{path: {kernel: {"ok", "wgmma", "mma", "cp_async",
    "shared", "error"}}}`` (``ok``: both compiled; ``cp_async``: asynchronous copies in the specialised PTX;
    ``shared``: the larger shared-memory size in bytes Triton allocated for the two compiles; ``atom``: the atomic
    instructions of the PTX, e.g. ``atom.global.acq_rel.gpu.add.u32``; in the specialised PTX, ``nc_loads``:
    non-coherent ``ld.global.nc`` loads, ``acquire`` / ``release``: GPU-scope acquire and release operations (an
    acquire load counts), ``bar_sync``: block barriers, ``prefetch``: L2 prefetches; ``regs`` / ``stack``:
    registers and stack bytes a thread, spills included, from ``cuobjdump``, -1 where unknown).
    """
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    cmd = [sys.executable, "-m", "verimirage.backend.gpucompile", "--arch", str(arch), *map(str, paths)]
    root = str(Path(__file__).resolve().parents[2])
    env["PYTHONPATH"] = root + os.pathsep + env.get("PYTHONPATH", "")
    res = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=timeout_s, check=False)
    if res.returncode != 0:
        raise RuntimeError(f"sm_{arch} compile subprocess failed (rc {res.returncode}):\n{res.stderr[-4000:]}")
    return json.loads(res.stdout.strip().splitlines()[-1])


def specialize(signature: dict[str, str]) -> tuple[dict[str, str], dict[str, int], dict[tuple[int, ...], Any]]:
    """The signature, constexprs and attributes Triton's JIT gives a kernel launched on contiguous tensors
    whose sizes are multiples of 16: each tensor's last stride is the constant 1, pointers and the other
    strides are divisible by 16. (Only then does the pipeliner turn loads into ``cp.async`` copies, and some
    layout passes run only then: a kernel must compile this way as well as unspecialised.)"""
    last: dict[str, int] = {}
    for a in signature:
        if "_s" in a:
            base, d = a.rsplit("_s", 1)
            last[base] = max(last.get(base, -1), int(d))
    sig: dict[str, str] = dict(signature)
    consts: dict[str, int] = {}
    attrs: dict[tuple[int, ...], Any] = {}
    for i, (a, t) in enumerate(signature.items()):
        if "_s" in a and int(a.rsplit("_s", 1)[1]) == last[a.rsplit("_s", 1)[0]]:
            sig[a] = "constexpr"
            consts[a] = 1
        elif t.startswith("*") or t == "i32":
            attrs[(i,)] = [["tt.divisibility", 16]]
    return sig, consts, attrs


def _resource_usage(cubin: bytes, name: str) -> dict[str, int]:
    """``{"regs", "stack"}`` of kernel ``name`` in ``cubin`` (registers a thread, stack bytes a thread: spilled
    registers and call frames), from ``cuobjdump --dump-resource-usage`` (Triton's bundled copy); empty where the
    tool or the kernel is not found."""
    import tempfile

    import triton

    tool = Path(triton.__file__).parent / "backends" / "nvidia" / "bin" / "cuobjdump"
    if not cubin or not tool.exists():
        return {}
    with tempfile.NamedTemporaryFile(suffix=".cubin") as f:
        f.write(cubin)
        f.flush()
        res = subprocess.run([str(tool), "--dump-resource-usage", f.name], capture_output=True, text=True,
                             check=False)
    m = re.search(rf"Function {re.escape(name)}:\s*\n\s*REG:(\d+) STACK:(\d+)", res.stdout)
    return {"regs": int(m.group(1)), "stack": int(m.group(2))} if m else {}


def _compile_one(path: str, arch: int) -> dict[str, Any]:
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    spec = importlib.util.spec_from_file_location(f"vm_aot_{Path(path).stem}", path)
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    out: dict[str, Any] = {}
    for name, sig in mod.SIGNATURES.items():
        fn = getattr(mod, name)
        opts = dict(mod.LAUNCH.get(name, {}))
        rep: dict[str, Any] = {"ok": True, "wgmma": False, "mma": False, "cp_async": 0, "shared": 0, "error": "",
                               "atom": [], "nc_loads": 0, "acquire": 0, "release": 0, "bar_sync": 0,
                               "regs": -1, "stack": -1}
        for label, src in (("plain", ASTSource(fn, dict(sig), {})), ("specialised", ASTSource(fn, *specialize(sig)))):
            try:
                ck = triton.compile(src, target=GPUTarget("cuda", arch, 32), options=opts)
                ptx = ck.asm["ptx"]
            except Exception as e:  # report, do not stop: the caller asserts
                rep.update(ok=False, error=rep["error"] + f"[{label}] {type(e).__name__}: {e}"[-2000:])
                continue
            rep["wgmma"] |= "wgmma" in ptx
            rep["mma"] |= "mma.sync" in ptx
            rep["shared"] = max(rep["shared"], int(ck.metadata.shared))
            rep["atom"] = sorted(set(rep.get("atom", [])) | set(re.findall(r"\batom\.[\w.]+", ptx)))
            if label == "specialised":
                rep["cp_async"] = ptx.count("cp.async.cg") + ptx.count("cp.async.ca")
                # (a persistent kernel reads what its own tasks wrote: non-coherent loads would be a race)
                rep["nc_loads"] = ptx.count("ld.global.nc")
                rep["acquire"] = ptx.count("gpu.acquire") + ptx.count("gpu.acq_rel")
                rep["release"] = ptx.count("gpu.release") + ptx.count("gpu.acq_rel")
                rep["bar_sync"] = ptx.count("bar.sync")
                rep["prefetch"] = ptx.count("prefetch.global.L2")
                rep.update(_resource_usage(ck.asm.get("cubin", b""), name))
        out[name] = rep
    return out


def main(argv: Sequence[str] | None = None) -> int:
    """Command-line entry: compile the given modules and print a JSON report."""
    import argparse

    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--arch", type=int, default=90)
    p.add_argument("paths", nargs="+")
    a = p.parse_args(argv)
    if os.environ.get("TRITON_INTERPRET"):
        raise SystemExit("unset TRITON_INTERPRET: the interpreter cannot compile for a GPU target")
    report = {path: _compile_one(path, a.arch) for path in a.paths}
    sys.stdout.write(json.dumps(report) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
