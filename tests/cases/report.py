"""Print, per corpus case, the verdict and which check caught it: ``python tests/cases/report.py``."""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))

from corpus import CASES

import verimirage as vm

if __name__ == "__main__":
    for c in CASES:
        v = vm.verify(c.a(), c.b())
        caught = ",".join(v.caught_by()) or "-"
        sys.stdout.write(f"{c.name:40s} expect={c.expect:10s} got={type(v).__name__:8s} caught_by={caught}\n")
