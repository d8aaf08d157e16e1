"""Regenerate proofs/: the certificate of the best verified candidate of every suite graph (batch 1 and 8).

    python scripts/regen_proofs.py [--names gqa lora ...] [--batches 1 8] [--out proofs]

Each file is re-checked with the independent checker before it is kept.
"""

from __future__ import annotations

import argparse
import logging
import sys
import time
from pathlib import Path

import verimirage as vm


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--names", nargs="*", default=vm.benchmarks.names())
    ap.add_argument("--batches", nargs="*", type=int, default=[1, 8])
    ap.add_argument("--out", default=str(Path(__file__).resolve().parent.parent / "proofs"))
    args = ap.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(message)s")
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    failed = 0
    for name in args.names:
        for b in args.batches:
            t0 = time.perf_counter()
            g = vm.benchmarks.get(name, batch=b)
            res = vm.superoptimize(g)
            if not res.candidates:
                logging.error("%s bs%d: no verified candidate", name, b)
                failed += 1
                continue
            path = out / f"{name}_bs{b}.json"
            res.best.certificate.save(str(path))
            v = vm.check_certificate(str(path))
            ok = isinstance(v, vm.Proved)
            failed += not ok
            logging.info("%s bs%d: %d kernel(s), %.1f s, re-check %s", name, b, res.best.mugraph.num_kernels,
                         time.perf_counter() - t0, type(v).__name__)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
