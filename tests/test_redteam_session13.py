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


def _simplified(g):  # type: ignore[no-untyped-def]
    """The lifted graph as a μGraph with ``scale(x, 1)`` read as ``x`` and repeated ops computed once: what a
    verified design may return (an output that is an input, one value for two outputs)."""
    import types

    import verimirage as vm
    from verimirage.ir.graph import MuGraph, node_list, output_refs

    mg = MuGraph()
    vals: dict[int, object] = {}
    seen: dict[tuple, object] = {}
    for i, n in enumerate(node_list(g)):
        if n.op == "input":
            vals[i] = mg.input(n.attr("name"), n.outs[0].shape, n.outs[0].dtype)
        elif n.op == "scale" and float(n.attr("c")) == 1.0:
            vals[i] = vals[n.args[0][0]]
        else:
            key = (n.op, tuple(id(vals[a]) for a, _ in n.args), str(n.attr_dict))
            if key not in seen:
                seen[key] = mg.apply(n.op, [vals[a] for a, _ in n.args], n.attr_dict)
            vals[i] = seen[key]
    for a, _ in output_refs(g):
        mg.output(vals[a])  # type: ignore[arg-type]
    assert vm.verify(g, mg).proved
    return types.SimpleNamespace(candidates=[mg], best=mg, report=types.SimpleNamespace(
        stop_reason="test", split=False, regions=[]))


@pytest.mark.parametrize("case", ["input", "twice"])
def test_a_verified_design_returning_an_input_or_one_value_twice_crashed_the_compiled_model(
        case: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """Finding (medium: an exception in the user's forward, no wrong value): a μGraph proved equal to a partition
    may return one of its inputs (``x * 1.0`` is ``x``) or one value for two outputs (``exp x`` computed twice in
    the model); the compiled program then returns that very tensor, ``PartitionRunner.kernels`` handed it out as
    the custom op's result, and torch refused it at every call ("The output of this custom operator ... may not
    alias any inputs to this custom operator or other returns"). The compile-time numeric check calls the runner
    directly, so the partition was taken. Now a result whose memory is an input's or an earlier result's is
    copied."""
    import verimirage as vm
    from verimirage.integrations.dynamo import backend
    from verimirage.integrations.report import Report

    monkeypatch.setitem(vm.__dict__, "superoptimize", lambda g, **kw: _simplified(g))

    def f(x):  # type: ignore[no-untyped-def]
        if case == "input":
            y = x * 1.0
            return y, y.exp()
        return x.exp() * 2.0, torch.exp(x) * 1.0 * 2.0  # (two outputs, one value in the design)

    x = torch.randn(4, 8)
    rep = Report()
    torch._dynamo.reset()
    got = torch.compile(f, backend=backend(report=rep, time_budget_s=5.0, fallback="eager", candidates=1))(x)
    want = f(x)
    assert rep.partitions and all(p.taken for p in rep.partitions), [p.reason for p in rep.partitions]
    for a, b in zip(got, want, strict=True):
        torch.testing.assert_close(a, b)
        assert a.untyped_storage().data_ptr() != x.untyped_storage().data_ptr()
    assert got[0].untyped_storage().data_ptr() != got[1].untyped_storage().data_ptr()


def test_restamp_and_sort_plan_handled_only_the_first_of_several_files(tmp_path) -> None:  # type: ignore[no-untyped-def]
    """Finding (low): ``--restamp-plan a.json b.json`` (and ``--sort-plan``) took one file each (``append``), so the
    second file became the positional module names and was silently left as it was (the landing instructions'
    ``plan_{decode,medium}_fp16.json`` restamped only the decode plan). Now each option takes several files; a
    module name beside them is a clear error."""
    import json
    import sys
    from pathlib import Path

    import pytest

    sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "benchmarks"))
    import corpus_capture as cc
    from test_capture_cost import ONE_STEP

    for opt in ("--restamp-plan", "--sort-plan"):
        plans = [tmp_path / f"{opt[2:]}_{i}.json" for i in range(3)]
        for p in plans:
            p.write_text(json.dumps({"g1": ONE_STEP}))  # a one-text entry: both commands rewrite it as a list
        assert cc.main([opt, str(plans[0]), str(plans[1]), opt, str(plans[2])]) == 0
        assert [json.loads(p.read_text()) for p in plans] == [{"g1": [ONE_STEP]}] * 3, opt
        with pytest.raises(SystemExit):
            cc.main(["gemm", opt, str(plans[0])])
