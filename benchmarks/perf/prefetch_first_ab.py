"""A/B of ``codegen.PDL_PREFETCH_FIRST_MAX_BLOCKS`` on the models set (device tool; fifteenth session).

    python3 benchmarks/perf/prefetch_first_ab.py BLOCKS OUTDIR bench.py-arguments...

Sets the constant in this process, then runs ``bench.py``'s main with the remaining arguments (``--prewarm 0``:
every module compiled here, with the constant as set; worker processes would import the default)."""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from verimirage.backend import codegen

if __name__ == "__main__":
    codegen.PDL_PREFETCH_FIRST_MAX_BLOCKS = int(sys.argv[1])
    out = sys.argv[2]
    sys.argv = ["bench.py", *sys.argv[3:], "--out", out]
    import bench

    sys.exit(bench.main())
