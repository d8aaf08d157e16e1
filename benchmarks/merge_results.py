"""Merge harness outputs (latest.json of several invocations on one machine) into one results file.

    python benchmarks/merge_results.py OUT.json IN1.json [IN2.json ...]
    python benchmarks/merge_results.py --append RESULTS.json NEW.json [--note TEXT]


The device tool limits one command to 10 minutes, so the batch-1 and batch-8 sweeps run as two
invocations of benchmarks/bench.py; this keeps each invocation's ceilings with its rows. A case measured
by several inputs keeps the row of the last one (a rerun after a change replaces the earlier row, in its
place); every row records the run it came from (``run``: index into ``runs``). For the models set the
Spearman summary is recomputed over the merged rows.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))


def append(results: str, new: str, note: str | None) -> int:
    """Add ``new``'s run to ``results`` (its ``runs`` list) and its rows in place of the same cases' rows. A row
    with no verimirage time (every candidate failed, or an error) does not replace a measured one: it is kept
    under ``unmerged`` with the run it came from, so the failure stays on record."""
    doc = json.loads(Path(results).read_text())
    d = json.loads(Path(new).read_text())
    run = {k: d[k] for k in ("device", "date", "ceilings", "torch", "triton")}
    if note:
        run["note"] = note
    doc.setdefault("runs", []).append(run)
    i = len(doc["runs"]) - 1
    rows = {r["case"]: r for r in doc["rows"]}
    for r in d["rows"]:
        r = {**r, "run": i}
        if r.get("verimirage_us") is None and r["case"] in rows:
            doc.setdefault("unmerged", []).append(r)
            continue
        rows[r["case"]] = r
    doc["rows"] = list(rows.values())
    from bench import spearman_summary, table

    if doc.get("set") == "models":
        doc["spearman"] = spearman_summary(doc["rows"])
    Path(results).write_text(json.dumps(doc, indent=1))
    print(table(doc))
    return 0


def main(argv: list[str]) -> int:
    if argv and argv[0] == "--append":
        note = argv[argv.index("--note") + 1] if "--note" in argv else None
        return append(argv[1], argv[2], note)
    out, *ins = argv
    docs = [json.loads(Path(p).read_text()) for p in ins]
    merged = dict(docs[0])
    rows: dict[str, dict] = {}
    for i, d in enumerate(docs):
        for r in d["rows"]:
            rows[r["case"]] = {**r, "run": i}
    merged["rows"] = list(rows.values())
    merged["runs"] = [{k: d[k] for k in ("device", "date", "ceilings", "torch", "triton")} for d in docs]
    from bench import spearman_summary, table

    if merged.get("set") == "models":
        merged["spearman"] = spearman_summary(merged["rows"])
    Path(out).write_text(json.dumps(merged, indent=1))

    print(table(merged))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
