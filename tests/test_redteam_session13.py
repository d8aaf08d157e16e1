"""Red team (thirteenth session): findings against what the twelfth session landed (views replacing reshape
kernels, programmatic dependent launch, stream order, the capture's numeric check, plan restamping, tuning), each
with the test that failed before its fix. The attacks that held are kept in ``tests/test_redteam_held13.py``."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")


def test_capture_close_took_any_non_finite_value_for_another() -> None:
    """Finding (low): the capture's numeric check (``integrations.capture._close``, and ``as_accurate`` against
    float64) compared only *where* the results are finite: kernels giving ``-inf`` or NaN where the ATen ops give
    ``+inf`` were accepted (the check is what stands between a proof over the reals and a kernel whose floating-point
    specials differ). Now the non-finite values must be the same (inf of the same sign, NaN for NaN)."""
    from verimirage.integrations.capture import _close, as_accurate

    inf, nan = float("inf"), float("nan")
    for dt in (torch.float16, torch.float32):
        want = torch.tensor([1.0, inf, 2.0, -inf, nan], dtype=dt)
        assert _close(want.clone(), want)  # identical specials: accepted
        ref = want.double()
        assert as_accurate(want.clone(), want, ref)
        for bad in ([1.0, -inf, 2.0, -inf, nan], [1.0, nan, 2.0, -inf, nan], [1.0, inf, 2.0, inf, nan],
                    [1.0, inf, 2.0, -inf, inf]):
            got = torch.tensor(bad, dtype=dt)
            assert not _close(got, want), bad
            assert not as_accurate(got, want, ref), bad
    # integer results are exact or wrong (an index one off passed within 2e-3 of the largest magnitude, 999)
    assert _close(torch.tensor([999, 5, 3]), torch.tensor([999, 5, 3]))
    assert not _close(torch.tensor([1000, 5, 3]), torch.tensor([999, 5, 3]))
    assert not as_accurate(torch.tensor([1000, 5, 3]), torch.tensor([999, 5, 3]), torch.tensor([999.0, 5, 3]))


def test_sort_plan_split_a_one_text_entry_into_its_characters(tmp_path) -> None:  # type: ignore[no-untyped-def]
    """Finding (low; not soundness: the wrecked items never re-check, so nothing wrong was served): a plan entry may
    be one μGraph text (``_serve_plan`` serves it as a list of one), but ``--sort-plan`` (``by_cost``) and
    ``--restamp-plan`` iterated it as a list: sort wrote it back as a list of its characters (each a "μGraph" that
    does not parse) and restamp would drop every character. Commit fc01650 did that to 3 of the 8 entries of
    ``plan_large_fp16.json`` (lists of 722-1,065 characters): those partitions served nothing. Now an entry is
    normalised to a list (``plan_items``) and the committed plan is repaired."""
    import json
    import sys
    from pathlib import Path

    sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "benchmarks"))
    import corpus_capture as cc
    from test_capture_cost import K_LOOP, ONE_STEP

    plan = tmp_path / "plan.json"
    plan.write_text(json.dumps({"g1": ONE_STEP, "g2": [K_LOOP, ONE_STEP], "g3": {"mugraph": K_LOOP,
                                                                               "certificate": "{}"}}))
    cc.sort_plan(plan)
    got = json.loads(plan.read_text())
    assert got["g1"] == [ONE_STEP] and got["g2"] == [K_LOOP, ONE_STEP] and len(got["g3"]) == 1
    assert cc.by_cost(ONE_STEP) == [ONE_STEP]  # type: ignore[arg-type]
    plan.write_text(json.dumps({"g1": ONE_STEP}))
    assert cc.restamp_plan(plan) == (0, 0) and json.loads(plan.read_text()) == {"g1": [ONE_STEP]}
    # every committed plan's entries are lists of μGraph texts or {mugraph, certificate} items
    for p in sorted((Path(__file__).resolve().parent.parent / "benchmarks/results/capture").glob("plan_*.json")):
        for key, items in json.loads(p.read_text()).items():
            assert isinstance(items, list) and items, (p.name, key[:80])
            for it in items:
                text = it["mugraph"] if isinstance(it, dict) else it
                assert isinstance(text, str) and text.startswith("mugraph {"), (p.name, key[:80], str(it)[:40])
