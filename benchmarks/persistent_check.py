"""Quick GPU check of the persistent-kernel lowering (``VERIMIRAGE_PERSISTENT``, issue 23) before timing it.

For each decode case: the committed best candidate compiled three ways -- merged launches (``VERIMIRAGE_MERGE``),
one persistent launch as a cooperative grid, one persistent launch as a plain grid -- then, for each persistent
program: its grid and launch parameters, ``--repeats`` calls on the same inputs (every output bitwise the same as
the first: a race between tasks would show as a difference), the error against the float64 module on two input sets
(two seeds), the largest difference from the merged program's output, and the median time of each program in one
CUDA graph (``do_bench``). Usage::

    python3 benchmarks/persistent_check.py --cases decode_bs1 decode_bs8 --out $OUT/check

Without a GPU (``--small``): the scaled-down cases in Triton's interpreter (one block; no timing).
"""

from __future__ import annotations

import argparse
import copy
import datetime
import json
import logging
import sys
import traceback
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(HERE.parent))

import layer as L  # noqa: E402

import verimirage as vm  # noqa: E402

log = logging.getLogger("persistent_check")


def check_case(case: str, small: bool, repeats: int, rank: int, modes: tuple[str, ...] = ("coop", "plain")
               ) -> dict[str, Any]:
    """The checks of the module docstring for one case."""
    import torch

    from verimirage.benchmarks.layer_module import make_case

    cuda = torch.cuda.is_available()
    _, cands, _ = L.load(L.DEFAULT_CANDIDATES, case, small)
    mg = cands[rank]
    row: dict[str, Any] = {"case": case, "rank": rank, "kernels": mg.num_kernels}
    sets = []
    for seed in (0, 1):
        c = make_case(case, small=small, dtype=torch.float16 if cuda else torch.float32,
                      device="cuda" if cuda else "cpu", seed=seed)
        g, gins = c["graph"], c["graph_inputs"]
        if not cuda:
            gins = {k: v.half() if v.is_floating_point() else v for k, v in gins.items()}
        with torch.no_grad():
            ref = copy.deepcopy(c["module"]).double()(*[x.double() for x in c["inputs"]])
        sets.append(([gins[t.name] for t in g.inputs], ref))
    ordered = sets[0][0]
    with L._merge(True), L._pdl("off"):
        merged = vm.compile(mg)
        merged_g = vm.compile(mg, cuda_graph=cuda)
    mout = merged(*ordered)
    mout = (mout if isinstance(mout, tuple) else (mout,))[0].clone()
    row["merged_launches"] = len(merged.steps)
    row["merged_err"] = L._rel(mout, sets[0][1])
    if cuda:
        L._precompile(merged_g, ordered)
        merged_g(*ordered)
        row["merged_us"] = L._bench(lambda: merged_g(*merged_g.static_inputs), cudagraph=False)
        row["merged_kernel_launches"], row["merged_kernel_sum_us"] = L._kernels(lambda: merged(*ordered))
    for mode in modes if cuda else ("plain",):
        rec: dict[str, Any] = {}
        row[mode] = rec
        try:
            with L._persistent(mode), L._merge(False), L._pdl("off"):
                fn = vm.compile(mg)
            first = fn(*ordered)
            first = tuple(o.clone() for o in (first if isinstance(first, tuple) else (first,)))
            rec.update(grid=dict(fn.grids), launch=fn.launch, tasks=[k.grid[0] for k in fn.kernels])
            same = 0
            for _ in range(repeats):
                o = fn(*ordered)
                o = o if isinstance(o, tuple) else (o,)
                same += all(bool(torch.equal(a, b)) for a, b in zip(first, o, strict=True))
            rec["same_calls"] = f"{same}/{repeats}"
            rec["err"] = L._rel(first[0], sets[0][1])
            rec["max_abs_diff_vs_merged"] = float((first[0].float() - mout.float()).abs().max())
            o2 = fn(*sets[1][0])
            rec["err_seed1"] = L._rel((o2 if isinstance(o2, tuple) else (o2,))[0], sets[1][1])
            if cuda:
                with L._persistent(mode), L._merge(False), L._pdl("off"):
                    fg = vm.compile(mg, cuda_graph=True)
                fg(*ordered)
                rec["graph_err"] = L._rel(fg(*ordered)[0] if isinstance(fg(*ordered), tuple) else fg(*ordered),
                                          sets[0][1])
                rec["us"] = L._bench(lambda fg=fg: fg(*fg.static_inputs), cudagraph=False)
                per: dict[str, float] = {}
                rec["kernel_launches"], rec["kernel_us"] = L._kernels(lambda fn=fn: fn(*ordered), per)
        except Exception as e:
            rec["error"] = f"{type(e).__name__}: {e}"[:600]
            log.error("%s %s: %s", case, mode, traceback.format_exc())
        log.info("%s %s: %s", case, mode, rec)
    return row


def main() -> int:
    """Command-line entry (see the module docstring)."""
    import torch

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--cases", nargs="*", default=["decode_bs1", "decode_bs8"])
    ap.add_argument("--small", action="store_true")
    ap.add_argument("--repeats", type=int, default=50)
    ap.add_argument("--rank", type=int, default=0)
    ap.add_argument("--out", type=Path, default=None)
    ap.add_argument("--modes", nargs="*", choices=["coop", "plain"], default=["coop", "plain"])
    a = ap.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(message)s")
    doc: dict[str, Any] = {
        "device": torch.cuda.get_device_name() if torch.cuda.is_available() else "cpu (interpreter)",
        "date": datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%d %H:%M UTC"), "rows": []}
    for case in a.cases:
        try:
            doc["rows"].append(check_case(case, a.small, a.repeats, a.rank, tuple(a.modes)))
        except Exception as e:
            doc["rows"].append({"case": case, "error": f"{type(e).__name__}: {e}"[:600]})
            log.error("%s: %s", case, traceback.format_exc())
    text = json.dumps(doc, indent=1)
    if a.out:
        a.out.mkdir(parents=True, exist_ok=True)
        (a.out / "persistent_check.json").write_text(text)
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
