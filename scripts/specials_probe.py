"""Special-values probe of the capture: where do a partition's kernels and its ATen ops part at infinities and NaN?

The capture's numeric check (``capture._check_sets``) draws finite inputs only, so a lifting formula that differs
from ATen only at +-inf or NaN passes it (red team, session 16: ``torch.logsumexp`` of a row whose max is infinite
was NaN where ATen gives +-inf). This script compiles the corpus modules (``verimirage.benchmarks.modules``) through
the backend, inference and training. After each partition passes its check it also runs the kernels and the ATen
ops on the check's first input set with special values written into every float input (not indices), and prints
each place where the kernels give NaN and ATen does not, or ATen gives an infinity and the kernels do not.

A row is a place to look, not a verdict: ATen's own fused kernels need not follow IEEE arithmetic either (the CPU
flash attention writes 0 for a row of NaN scores, where the math is NaN). Run from the repository root::

    TRITON_INTERPRET=1 PYTHONPATH=. python scripts/specials_probe.py [module ...]
"""

from __future__ import annotations

import math
import os
import sys
import time
from typing import Any

os.environ.setdefault("TRITON_INTERPRET", "1")

import torch

from verimirage.benchmarks import modules as corpus
from verimirage.integrations import capture
from verimirage.integrations.dynamo import backend
from verimirage.integrations.report import Report

MODES = ("specials", "neginf_row", "posinf", "neginf")


def inject(xs: list[Any], skip: set[int], mode: str) -> list[Any]:
    """``xs`` with special values written into each float input not in ``skip`` (copies, made contiguous)."""
    out = []
    for i, x in enumerate(xs):
        if i in skip or not x.is_floating_point() or x.numel() == 0:
            out.append(x)
            continue
        y = x.contiguous().clone()
        f = y.view(-1)
        if mode == "specials":
            for k, v in enumerate((math.inf, -math.inf, math.nan, 0.0, -0.0, 1e4, -1e4)):
                f[(k * 13 + 5 * i) % f.numel()] = v
        elif mode == "neginf_row" and y.dim() >= 1:
            y.view(-1, y.shape[-1])[0] = -math.inf
        elif mode in ("posinf", "neginf"):
            f[(3 + i) % f.numel()] = math.inf if mode == "posinf" else -math.inf
        out.append(y)
    return out


def parted(ours: Any, aten: Any) -> Any:
    """Where the kernels give NaN and ATen does not, or ATen gives an infinity and the kernels do not."""
    a, b = ours.double(), aten.double()
    return (a.isnan() & ~b.isnan()) | (b.isinf() & (a != b))


def main(names: list[str]) -> int:
    found: list[str] = []
    checked = capture._check_runner

    def probe(runner: Any, xs: list[Any], want: Any, gm: Any, lifted: Any, opts: Any, device: Any,
              name: str) -> str | None:
        why = checked(runner, xs, want, gm, lifted, opts, device, name)
        if why is not None:
            return why
        skip = set(lifted.int_inputs) | set(capture._index_ranges(lifted))
        for mode in MODES:
            try:
                ys = inject(xs, skip, mode)
                with torch.no_grad():
                    pairs = list(zip(runner.kernels(ys), runner.eager(*ys), strict=True))
            except Exception as e:  # (a probe failure must not change the capture)
                found.append(f"{name} {mode}: {type(e).__name__}: {str(e)[:100]}")
                continue
            for k, (a, b) in enumerate(pairs):
                bad = parted(a, b)
                if bool(bad.any()):
                    i = int(bad.reshape(-1).nonzero()[0])
                    found.append(f"{name} {mode}: output {k}, {int(bad.sum())} elements, e.g. kernels "
                                 f"{float(a.reshape(-1)[i])} ATen {float(b.reshape(-1)[i])}; ops "
                                 f"{list(runner.record.ops)[:10]}")
        return None

    capture._check_runner = probe
    for nm in names:
        t0 = time.time()
        model, xs = corpus.get(nm)
        for train in (False, True):
            n0 = len(found)
            torch._dynamo.reset()
            cm = torch.compile(model, backend=backend(report=Report(), time_budget_s=8.0, fallback="eager",
                                                      candidates=1))
            if train:
                out = cm(*[x.detach().requires_grad_() if x.is_floating_point() else x for x in xs])
                out.float().sum().backward()
            else:
                with torch.no_grad():
                    cm(*xs)
            for line in found[n0:]:
                print(f"PARTED {nm} ({'training' if train else 'inference'}): {line}", flush=True)
        print(f"{nm}: {time.time() - t0:.0f} s", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:] or list(corpus.CORPUS)))
