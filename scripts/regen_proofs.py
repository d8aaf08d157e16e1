"""Regenerate proofs/: the certificate of the best verified candidate of every suite graph (batch 1 and 8).

    python scripts/regen_proofs.py [--names gqa lora ...] [--batches 1 8] [--out proofs]
    python scripts/regen_proofs.py --recertify proofs/gated_mlp_bs1.json ... [--timeout-s 300] [--floor]
    python scripts/regen_proofs.py --restamp proofs/*.json
    python scripts/regen_proofs.py --relaw proofs/*.json
    python scripts/regen_proofs.py --reff proofs/*.json benchmarks/results/capture/plan_*.json

Each certificate is checked with the independent checker before it is written (a rejected one is not).
``--recertify`` re-makes the given certificates for the same program pair (their own graph and candidate texts and
rules; the Triton hash of today's code generator) after a change of the verifier's meanings (an op's exact meaning
changes the recorded queries), without a search; with ``--floor`` the candidate is first re-derived in the floored
online softmax form (:func:`verimirage.rewrite.floor.floor_running_maxes`, red team 17: an unfloored one is NaN on a
row whose first key tiles are all -inf), and a certificate with nothing to floor is left as it is. ``--restamp``
only records the Triton hash of today's code generator in the given certificates (after a code-generator change: the
hash is neither part of the proof nor of the seeds, and the checker regenerates the module and compares; re-check
the files afterwards, e.g. with the tests). ``--relaw`` re-derives the normaliser law names each certificate (and
each sub-certificate of a composed one) records, after a change that only renames them (e.g. an op becoming a
composition: ``rms-def`` -> ``mean-def``, ``rsqrt-def``); the queries, seeds and bounds are left as they are, and
the checker re-derives all of them: re-check afterwards. ``--reff`` re-records the finite-field record
(``ff_record``: trials, seeds, fields, bounds: a function of the two programs only) of each certificate,
sub-certificate and capture-plan item's certificate, after a change of the degree analysis; the checker re-derives
the record and re-runs the trials: re-check afterwards.
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
    ap.add_argument("--recertify", nargs="*", default=None, help="certificate files to re-make in place")
    ap.add_argument("--restamp", nargs="*", default=None, help="certificate files whose Triton hash to update")
    ap.add_argument("--relaw", nargs="*", default=None, help="certificate files whose law names to re-derive")
    ap.add_argument("--reff", nargs="*", default=None, help="certificate or plan files whose ff records to redo")
    ap.add_argument("--timeout-s", type=float, default=300.0, help="--recertify: the verifier's Z3 time limit")
    ap.add_argument("--floor", action="store_true", help="--recertify: floor the candidate's online softmaxes first")
    args = ap.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(message)s")
    if args.restamp is not None:
        return restamp([Path(p) for p in args.restamp])
    if args.relaw is not None:
        return relaw([Path(p) for p in args.relaw])
    if args.reff is not None:
        return reff([Path(p) for p in args.reff])
    if args.recertify is not None:
        return recertify([Path(p) for p in args.recertify], args.timeout_s, floor=args.floor)
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
            v = vm.check_certificate(res.best.certificate)
            ok = isinstance(v, vm.Proved)
            failed += not ok
            if ok:  # a certificate the checker rejects is never written over a good one
                res.best.certificate.save(str(path))
            logging.info("%s bs%d: %d kernel(s), %.1f s, re-check %s", name, b, res.best.mugraph.num_kernels,
                         time.perf_counter() - t0, type(v).__name__)
    return 1 if failed else 0


def restamp(paths: list[Path]) -> int:
    """Record today's Triton hash in each certificate of ``paths`` that records one (the text edited in place)."""
    import json

    from verimirage.backend.tuning import triton_digest

    for p in paths:
        text = p.read_text()
        d = json.loads(text)
        old = d.get("triton_source_sha256")
        if old is None:
            continue
        new = triton_digest(d["mugraph_text"])
        if new != old:
            assert text.count(old) == 1, p
            p.write_text(text.replace(old, new))
            logging.info("%s: Triton hash %s -> %s", p, old[:12], new[:12])
    return 0


def _laws(g: vm.Graph, mg: vm.Graph, queries: list[dict]) -> list[str]:
    """The normaliser laws the checker's re-derivation of the pair uses (as ``certificate._check_abstract``)."""
    from verimirage.smt import abstract as A
    from verimirage.smt import expr as E

    _, ((ea, la, _), (eb, lb, _)) = A.derive_all([g, mg])
    laws = set(la | lb)
    for (k, ci), q in zip([(k, ci) for k, xs in enumerate(ea) for ci in range(len(xs))], queries, strict=True):
        if q["name"].endswith(":fubini"):
            (_, lx), (_, ly) = E.canon_sums(ea[k][ci]), E.canon_sums(eb[k][ci])
            laws |= lx | ly
    return sorted(laws)


def relaw(paths: list[Path]) -> int:
    """Re-derive the law names of each certificate in ``paths`` (sub-certificates too), edited in place."""
    import json

    from verimirage.smt.deep import deep_call

    for p in paths:
        d = json.loads(p.read_text())
        changed = False
        for c in d.get("certificates", [d]):
            g, mg = vm.Graph.parse(c["graph_text"]), vm.MuGraph.parse(c["mugraph_text"])
            laws = deep_call(_laws, g, mg, c["queries"])
            if laws != sorted(c["laws"]):
                old = set(c["laws"])
                logging.info("%s: laws %s -> %s", p, sorted(old - set(laws)), sorted(set(laws) - old))
                c["laws"], changed = laws, True
        if changed:
            p.write_text(json.dumps(d, indent=1, sort_keys=True))
    return 0


def reff(paths: list[Path]) -> int:
    """Re-record the finite-field record of each certificate in ``paths`` (sub-certificates and the certificates
    of a capture plan's items too), edited in place."""
    import json

    from verimirage.smt.certificate import ff_record

    def redo(d: dict) -> int:
        n = 0
        for c in d.get("certificates", [d]):
            r = ff_record(vm.Graph.parse(c["graph_text"]), vm.MuGraph.parse(c["mugraph_text"]))
            n += json.dumps(r, sort_keys=True) != json.dumps(c["ff"], sort_keys=True)
            c["ff"] = r
        return n

    for p in paths:
        d = json.loads(p.read_text())
        if "graph_text" in d or "certificates" in d:
            n = redo(d)
            text = json.dumps(d, indent=1, sort_keys=True)
        else:  # a capture plan: {graph text: [mugraph text | {"mugraph", "certificate"}]}
            n = 0
            for it in (it for items in d.values() for it in items if isinstance(it, dict)):
                c = json.loads(it["certificate"])
                n += redo(c)
                it["certificate"] = json.dumps(c, indent=1, sort_keys=True)
            text = json.dumps(d, indent=1)
        if n:
            p.write_text(text)
        logging.info("%s: %d finite-field record(s) changed", p, n)
    return 0


def recertify(paths: list[Path], timeout_s: float, *, floor: bool = False) -> int:
    """Re-make each certificate in ``paths`` for its own pair (``floor``: its candidate's online softmaxes floored
    first; one with none is skipped); 1 if any is not Proved or fails its re-check."""
    from verimirage.backend.tuning import triton_digest
    from verimirage.rewrite.floor import floor_running_maxes
    from verimirage.smt.certificate import Certificate
    from verimirage.smt.certify import make_certificate

    failed = 0
    for path in paths:
        t0 = time.perf_counter()
        old = Certificate.load(path)
        g, mg = vm.Graph.parse(old.graph_text), vm.MuGraph.parse(old.mugraph_text)
        if floor:
            if (floored := floor_running_maxes(mg)) is mg:
                logging.info("%s: nothing to floor", path)
                continue
            mg = floored
        v = vm.verify(g, mg, timeout_s=timeout_s)
        if not isinstance(v, vm.Proved):
            logging.error("%s: %s", path, v.reason)
            failed += 1
            continue
        cert = make_certificate(g, mg, v, old.rules, old.trusted_rules, triton_digest(mg), timeout_s=timeout_s)
        ok = isinstance(vm.check_certificate(cert), vm.Proved)
        failed += not ok
        if ok:  # checked before it replaces the file, which keeps the old certificate otherwise
            cert.save(str(path))
        logging.info("%s: %.1f s, re-check %s", path, time.perf_counter() - t0, "Proved" if ok else "FAILED")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
