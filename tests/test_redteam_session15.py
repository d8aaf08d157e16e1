"""Red team (fifteenth session): findings against the verifier, the certificate checker and what they trust, each
with the test that failed before its fix. The attacks that held are kept in ``tests/test_redteam_held15.py``."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

import verimirage as vm
from verimirage.pipeline import pricing


def _exp_program(shape: tuple[int, int]) -> tuple[vm.Graph, vm.MuGraph]:
    g = vm.Graph()
    x = g.input("X", shape, vm.float16)
    g.output(g.exp(g.add(x, x)))
    return g, vm.MuGraph.parse(str(g).replace("graph {", "mugraph {", 1))


def test_mode_check_read_the_certificate_file_twice(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """Finding (low-medium; a wrong "matched" under a concurrent writer): ``vm.check_certificate(path, mode=M,
    module_source=S)`` (``check-cert --mode M --module S``) checked the file in the checker process, then, for a
    certificate with no Triton hash (or ``triton=False``), read the file *again* for the μGraph whose mode-M module it
    regenerated and compared with ``S``. A file replaced between the two reads (here: right after the check) had
    ``S``, the module of a μGraph no certificate proved, reported "Proved ... regenerated and matched". Now the
    file is read once: the μGraph whose module is compared is the one the checker checked."""
    from verimirage import checkcall
    from verimirage.backend.tuning import tuned_module
    from verimirage.pipeline import certificates as P
    from verimirage.smt.certify import certify

    g, mg = _exp_program((16, 32))
    cert = certify(g, mg)  # (no Triton hash: the checker confirms no module of its own)
    assert cert.triton_source_sha256 is None
    other = vm.Graph()  # an unproved μGraph of another program, whose merged module is the one that runs
    x = other.input("X", (16, 32), vm.float16)
    other.output(other.sqrt(x))
    bad_mg = vm.MuGraph.parse(str(other).replace("graph {", "mugraph {", 1))
    path = tmp_path / "cert.json"
    path.write_text(cert.to_json())
    swapped = json.loads(cert.to_json())
    swapped["mugraph_text"] = str(bad_mg)  # (no check would pass this file; nothing checks it)
    real = checkcall.check_certificate

    def check_then_swap(*a: Any, **k: Any) -> vm.Verdict:
        v = real(*a, **k)
        path.write_text(json.dumps(swapped))  # (a writer replacing the file once the checker has read it)
        return v

    monkeypatch.setattr(checkcall, "check_certificate", check_then_swap)
    module = tuned_module(bad_mg, "merge").source
    v = P.check_certificate(path, mode="merge", module_source=module, isolate=False)
    assert not v.proved and "the module that runs" in v.reason, v.reason
    # the module of the μGraph that was checked still matches, read from the file once
    path.write_text(cert.to_json())
    v = P.check_certificate(path, mode="merge", module_source=tuned_module(mg, "merge").source, isolate=False)
    assert v.proved, v.reason


def test_search_cache_rechecked_a_tampered_huge_mugraph_in_process_without_a_memory_cap(
        monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """Finding (medium; a tampered cache entry could take the caller's memory instead of being a miss): the search
    cache re-checks a served candidate's certificate in the caller's process (``isolate=False``: no checker-process
    start-up), i.e. without the checker process's memory cap, whatever the μGraph it names. A tampered entry's
    μGraph of the requested ``exp(X)`` (X 4 x 4) with an intermediate of 2**30 elements (a broadcast to 2**26
    copies, exp, max back: 16 GiB per finite-field trial) was evaluated there: on a machine with the memory, an
    out-of-memory kill of the caller, not a rejected entry. Now the re-check runs in this process only where both
    programs' evaluations hold at most ``IN_PROCESS_ELEMENTS`` elements, else in the capped checker process."""
    from verimirage.pipeline import certificates as P
    from verimirage.pipeline import search_cache as S
    from verimirage.smt.certificate import Certificate, sha256

    monkeypatch.setenv("VERIMIRAGE_CACHE_DIR", str(tmp_path))
    g = vm.Graph()
    g.output(g.exp(g.input("X", (4, 4), vm.float32)))
    big = vm.Graph()
    x = big.input("X", (4, 4), vm.float32)
    big.output(big.reshape(big.max(big.exp(big.broadcast_to(x, (2**26, 4, 4))), 0), (4, 4)))
    mg = vm.MuGraph.from_graph(big)
    gt, mt = str(g), str(mg)
    cert = Certificate(gt, sha256(gt), mt, sha256(mt), [], [], [], [], [], {})
    seen: list[dict[str, Any]] = []
    key = "ab" * 32

    def record(path: Any, **kw: Any) -> vm.Verdict:  # (no check runs here: where it would run is the point)
        seen.append(kw)
        return vm.Unknown("not checked in this test")

    monkeypatch.setattr(P, "check_certificate", record)
    import dataclasses

    from verimirage.pipeline.pricing import cost

    cand = {"mugraph": mt, "cost": dataclasses.asdict(cost(vm.MuGraph.from_graph(g))), "rules": [], "graph": None,
            "certificate": cert.to_json(), "verdict_reason": ""}
    S._store().put(key, {"format": S.FORMAT, "candidates": [cand], "sha256": S._checksum([cand]), "report": ""})
    assert S.load(key, g, fp_check=lambda m: None) is None  # (rejected: the recorded check is no Proved)
    assert len(seen) == 1 and seen[0].get("isolate", True) is True, seen
    # a small μGraph (the plain one) is still re-checked in this process
    mt = str(vm.MuGraph.from_graph(g))
    cand = {**cand, "mugraph": mt, "certificate": Certificate(gt, sha256(gt), mt, sha256(mt), [], [], [], [], [],
                                                                {}).to_json()}
    S._store().put(key, {"format": S.FORMAT, "candidates": [cand], "sha256": S._checksum([cand]), "report": ""})
    assert S.load(key, g, fp_check=lambda m: None) is None
    assert len(seen) == 2 and seen[1].get("isolate") is False, seen


def test_scaled_weight_tiles_flushed_small_products_beside_a_huge_one_in_another_column() -> None:
    """Finding (low; a strict xfail until the sixteenth session): ``rms_norm(x, w) @ m`` lowered with the
    fourteenth session's ``scale_weight_tiles`` rounded ``(w_i m_ij) / s`` to fp16 for ``tl.dot`` with one ``s =
    max(1, max |w_i m_ij| / 2**15)`` per loop iteration's tile (be5393c): a product below ``s * 2**-25`` was
    flushed to 0. One outlier weight ``w_0 = 6e4`` on a weight row with one large entry ``m_00 = 60`` (``s = 110``;
    its channel idle in ``x``) beside ``w_i = 1e-3``, ``m_ij ~ 1e-3`` elsewhere: every other product ``w_i m_ij ~
    1e-6`` of the outlier's tile became ``9e-9 -> 0``, and the outputs lost that iteration's half of their sum
    (51% off) where the source (``x r w`` rounded to fp16, products in fp32) is within 1e-3 of float64 (Proved;
    the floating-point check looked for non-finite values only). Now ``stabilise.prologue_norm_scales`` gives
    ``tl.dot`` the source's own operand ``x r w`` (the row statistic before the loop, ``w`` on the activation side)
    and the weight tile as loaded: nothing is scaled, so nothing is flushed that the source keeps; and the
    floating-point check's outlier sets reject the old form (``test_stale_candidates``)."""
    import numpy as np
    from test_redteam_session14 import scaled_weight_tile_design

    from verimirage.pipeline.fpsafe import evaluate_in_dtype

    g, mg = scaled_weight_tile_design()
    rng = np.random.default_rng(0)
    x = rng.uniform(0.5, 1, (4, 64))
    x[:, 0] = 0.0  # (the outlier channel idle)
    w = np.full(64, 1e-3)
    w[0] = 6e4
    m = rng.uniform(1, 2, (64, 32)) * 1e-3
    m[0, 0] = 60.0
    ins = {k: v.astype(np.float16).astype(np.float64) for k, v in {"X": x, "G": w, "W": m}.items()}
    want = vm.evaluate(g, ins)[0]
    scale = np.abs(want).max()
    (src,), _ = evaluate_in_dtype(g, ins)
    assert np.abs(src - want).max() < 2e-3 * scale  # (the source: fp16-accurate)
    (got,), _ = evaluate_in_dtype(mg, ins, generated=True)  # (as the kernel computes: the interpreter agrees)
    assert np.abs(got - want).max() < 2e-2 * scale


def _candidates_finite(g: vm.Graph, ins: dict[str, Any]) -> None:
    """Every candidate ``vm.superoptimize`` returns for ``g`` is finite on ``ins``, where ``g`` is (in its dtype)."""
    import numpy as np

    from verimirage.pipeline.fpsafe import evaluate_in_dtype

    res = vm.superoptimize(g, cache=False, top_k=4)
    assert res.candidates
    (src,), _ = evaluate_in_dtype(g, ins)
    assert np.isfinite(src).all()
    for c in res.candidates:
        (got,), _ = evaluate_in_dtype(c.mugraph, ins, generated=True)
        assert np.isfinite(got).all(), (c.rules, str(c.mugraph))


def _structural_rejects(g: vm.Graph, f: vm.Graph, why: str) -> None:
    """``g`` is above the numeric check's size limit; the structural check alone rejects the first lowerings of
    ``f`` (``why`` in the reason) and passes ``g``'s own."""
    from verimirage.pipeline.fpsafe import SafetyChecker
    from verimirage.rewrite.partition import lower_all

    sc = SafetyChecker(g)
    assert not sc.numeric
    lows = lower_all(f, rank=pricing.cost)[0][:3]
    assert lows and all(why in (sc.check(low.mugraph) or "") for low in lows)
    assert all(sc.check(low.mugraph) is None for low in lower_all(g, rank=pricing.cost)[0][:3])


def test_factored_product_summed_two_fp16_weights_into_an_operand_and_the_fp_check_passed_it() -> None:
    """Finding (medium; the search's best candidate inf where the source is finite): rule ``matmul-add-factor``
    turns ``x @ w1 + x @ w2`` into ``x @ (w1 + w2)``, whose operand ``w1 + w2`` ``tl.dot`` takes in fp16: inf at
    ``w1 = w2 = 4e4`` (``x = 0.01``, 64 deep), where the source (products of exact fp16 inputs, summed in fp32 and
    stored: 51,200) is finite. It is Proved, and the floating-point check passed it: its input sets scale all
    inputs together (the source's products overflow first) or one input alone (no sum reaches 65504), never two
    inputs large and the rest small; above the numeric check's size limit only exps were looked at. It was
    ``vm.superoptimize``'s best candidate. Now the structural check (every size) rejects a candidate that rounds a
    sum to fp16 for a product where the source rounds no such sum (``fpsafe.fp16_sums``): no committed candidate
    (422, and the 31 certificates' μGraphs) does."""
    import numpy as np

    h = vm.float16

    def progs(m: int, k: int, n: int) -> tuple[vm.Graph, vm.Graph]:
        g, f = vm.Graph(), vm.Graph()
        x, w1, w2 = (g.input(nm, s, h) for nm, s in (("X", (m, k)), ("W1", (k, n)), ("W2", (k, n))))
        g.output(g.add(g.matmul(x, w1), g.matmul(x, w2)))
        x, w1, w2 = (f.input(nm, s, h) for nm, s in (("X", (m, k)), ("W1", (k, n)), ("W2", (k, n))))
        f.output(f.matmul(x, f.add(w1, w2)))
        return g, f

    _candidates_finite(progs(4, 64, 16)[0], {"X": np.full((4, 64), 1e-2), "W1": np.full((64, 16), 4e4),
                                             "W2": np.full((64, 16), 4e4)})
    _structural_rejects(*progs(8, 2048, 1024), "sums W1+W2 into an fp16 operand")


def test_exp_of_a_difference_split_into_a_quotient_of_exps_overflowed_and_the_fp_check_passed_it() -> None:
    """Finding (medium; the search's best candidate NaN where the source is finite): ``exp(S - L) @ V`` (attention
    from a saved row statistic ``L``, its log-sum-exp: FlashAttention's backward recomputes ``P`` so) became
    ``(exp(S) @ V) / exp(L)`` (rules ``exp-sub``, ``defer-normalisation``): at logits near 100, ``L = 100``, fp32's
    exp overflows past 88.7 and the candidate is inf / inf where the source (``exp`` of values near 0) is within
    fp16 of float64. It is Proved, it was ``vm.superoptimize``'s best candidate, and the floating-point check
    passed it: its sets never make ``S`` and ``L`` large and close (independent values at scale 100 overflow the
    source's ``exp(S - L)`` itself), and the structural check protected only max-shifted exps. Now where the
    source applies exp only to differences (or sums) the candidate must too (``fpsafe.exps_of_sums``, every size):
    the 184 committed candidates of such sources all do."""
    import numpy as np

    from verimirage.pipeline.fpsafe import evaluate_in_dtype

    h = vm.float16

    def progs(m: int, k: int, n: int) -> tuple[vm.Graph, vm.Graph]:
        g, f = vm.Graph(), vm.Graph()
        s, lse, v = (g.input(nm, sh, h) for nm, sh in (("S", (m, k)), ("L", (m, 1)), ("V", (k, n))))
        g.output(g.matmul(g.exp(g.sub(s, lse)), v))
        s, lse, v = (f.input(nm, sh, h) for nm, sh in (("S", (m, k)), ("L", (m, 1)), ("V", (k, n))))
        f.output(f.div(f.matmul(f.exp(s), v), f.exp(lse)))
        return g, f

    g, _ = progs(16, 64, 16)
    rng = np.random.default_rng(0)
    raw = {"S": rng.uniform(95, 100, (16, 64)), "L": np.full((16, 1), 100.0), "V": rng.uniform(-1, 1, (64, 16))}
    ins = {k: v.astype(np.float16).astype(np.float64) for k, v in raw.items()}
    (src,), _ = evaluate_in_dtype(g, ins)
    want = vm.evaluate(g, ins)[0]
    assert np.abs(src - want).max() < 1e-2 * np.abs(want).max()  # (the source: within fp16 of float64)
    _candidates_finite(g, ins)
    _structural_rejects(*progs(512, 4096, 64), "exp only to sums or differences")


def test_exp_of_a_sum_split_into_a_product_of_exps_overflowed_and_the_fp_check_passed_it() -> None:
    """Finding (medium; the same class as the quotient's, through rule ``exp-add``): ``exp(S + NL) @ V`` (the saved
    statistic negated) became ``(exp(S) @ V) * exp(NL)`` (``exp-add``, ``matmul-rowscale``), inf * 0 at logits near
    100, ``NL = -100``, where the source is finite; Proved, the best candidate, passed by the check (the ``+-100``
    set overflows the source itself and is skipped). Now a sum counts as a shift too (``fpsafe.exps_of_sums``)."""
    import numpy as np

    h = vm.float16
    g = vm.Graph()
    s, nl, v = g.input("S", (16, 64), h), g.input("NL", (16, 1), h), g.input("V", (64, 16), h)
    g.output(g.matmul(g.exp(g.add(s, nl)), v))
    rng = np.random.default_rng(0)
    _candidates_finite(g, {"S": rng.uniform(95, 100, (16, 64)).astype(np.float16).astype(np.float64),
                           "NL": np.full((16, 1), -100.0),
                           "V": rng.uniform(-1, 1, (64, 16)).astype(np.float16).astype(np.float64)})


@pytest.mark.parametrize("mode", [None, "merge"])
def test_check_cert_blamed_the_launch_mode_for_a_file_that_is_not_json(mode: str | None, tmp_path: Path,
                                                                        capsys: pytest.CaptureFixture[str]) -> None:
    """Finding (low; a wrong message): ``verimirage check-cert FILE`` on a file that is not a JSON object said
    ``check-cert: --mode None: certificate ...: not JSON`` (``--mode 'merge'`` with one): the checker's
    CertificateError is a ValueError, which the command took for an unknown launch-mode option. It now names the
    file alone (exit 2, usage)."""
    from verimirage.cli import main

    for text in ("not json", "[1, 2]"):
        p = tmp_path / "c.json"
        p.write_text(text)
        assert main(["check-cert", str(p), *(["--mode", mode] if mode else [])]) == 2
        err = capsys.readouterr().err
        assert "--mode" not in err and str(p) in err, err
    assert main(["check-cert", str(p), "--mode", "fused"]) == 2  # (an unknown option is still the mode's)
    assert "--mode 'fused'" in capsys.readouterr().err
