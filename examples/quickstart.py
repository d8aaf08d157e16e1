"""The main job: superoptimize a suite program end to end and show what was found.

    python examples/quickstart.py [NAME] [--batch N] [--full] [-v]

Builds the program (small shapes by default, so that the kernels can run in
Triton's CPU interpreter), searches for verified μGraphs, prints the
candidates, checks the best one's certificate, compiles it to Triton and
compares its output with the float64 reference.

Output: the program, the search report, the candidates and the result on
stdout; a progress bar on stderr while the search runs (when stderr is a
terminal); warnings only, unless ``-v`` (verimirage's INFO log) or
``VERIMIRAGE_LOG`` asks for more. Only the ``verimirage`` logger is
configured, never the root logger (egglog's own log stays quiet).
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time

import numpy as np


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("name", nargs="?", default="gqa_stable")
    ap.add_argument("--batch", type=int, default=1)
    ap.add_argument("--full", action="store_true", help="full-size shapes (search only; no CPU kernel run)")
    ap.add_argument("-v", "--verbose", action="count", default=0, help="verimirage's log at INFO (-vv: egglog's too)")
    args = ap.parse_args(argv)
    from verimirage.logs import configure

    configure(args.verbose)  # the verimirage logger only (a handler on stderr), never the root logger

    import torch

    if not torch.cuda.is_available():
        os.environ.setdefault("TRITON_INTERPRET", "1")
    import verimirage as vm

    g = vm.benchmarks.get(args.name, batch=args.batch, small=not args.full)
    print(f"== {args.name} (batch {args.batch}, {'full' if args.full else 'small'} shapes)")
    print(g)
    t0 = time.perf_counter()
    res = vm.superoptimize(g)  # a progress bar on stderr when it is a terminal
    dt = time.perf_counter() - t0
    print(f"\n== search: {dt:.1f} s, {len(res.candidates)} verified candidate(s)")
    print(res.report)
    for i, c in enumerate(res.candidates[:5]):
        print(f"  #{i}: {c.mugraph.num_kernels} kernel(s), {type(c.verdict).__name__}, cost {c.cost}")
    best = res.best
    if best is None:
        print("nothing verified", file=sys.stderr)
        return 1
    print("\n== best μGraph")
    print(best.mugraph)
    print(f"verdict: {best.verdict.summary()}")
    with tempfile.TemporaryDirectory() as d:
        path = os.path.join(d, "cert.json")
        best.certificate.save(path)
        print(f"independent certificate check: {vm.check_certificate(path).summary()}")
    if args.full and not torch.cuda.is_available():
        return 0
    fn = vm.compile(best)
    dev = "cuda" if torch.cuda.is_available() else "cpu"
    gen = torch.Generator().manual_seed(0)
    ins = [torch.randn(t.shape, generator=gen).to(dev, torch.float16) for t in g.inputs]
    out = fn(*ins)
    outs = out if isinstance(out, tuple) else (out,)
    ref = vm.evaluate(g, {t.name: x for t, x in zip(g.inputs, ins, strict=True)})
    for o, r in zip(outs, ref, strict=True):
        err = np.linalg.norm(o.double().cpu().numpy() - r) / np.linalg.norm(r)
        print(f"compiled kernel vs float64 reference: relative error {err:.2e}")
        if not err < 2e-2:
            print("MISMATCH", file=sys.stderr)
            return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
