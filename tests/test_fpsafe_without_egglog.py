"""The floating-point safety check runs on a machine without egglog (the GPU machines: plans re-checked there)."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def test_plan_recheck_on_a_machine_without_egglog_failed_in_the_safety_check(tmp_path: Path) -> None:
    """Regression: ``SafetyChecker.structural`` imported the search orchestrator (and through it egglog), so on the
    device every served plan entry failed its re-check with ModuleNotFoundError and no partition was taken."""
    (tmp_path / "egglog.py").write_text("raise ModuleNotFoundError(\"No module named 'egglog'\")\n")
    code = textwrap.dedent("""
        import verimirage as vm
        from verimirage.pipeline.fpsafe import SafetyChecker
        g = vm.Graph()
        x = g.input("X", (4, 8), vm.float32)
        e = g.exp(g.sub(x, g.max(x, axis=1)))
        g.output(g.div(e, g.sum(e, axis=1)))
        s = SafetyChecker(g)
        assert s.structural(g) is None
        from verimirage.pipeline.fpsafe import max_shifted
        assert max_shifted(g)
        import sys
        assert "verimirage.rewrite" not in sys.modules, sorted(m for m in sys.modules if m.startswith("verimirage"))
        print("ok")
    """)
    env = {"PYTHONPATH": f"{tmp_path}:{ROOT}", "PATH": "/usr/bin:/bin"}
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, cwd=ROOT, timeout=120)
    assert r.returncode == 0 and r.stdout.strip().endswith("ok"), r.stderr[-2000:]


def test_plan_serving_on_a_machine_without_egglog_failed_in_the_cost_ordering(tmp_path: Path) -> None:
    """Regression (eleventh session, H100 18:40 UTC): ``corpus_capture.by_cost`` (plan items cheapest by today's
    cost model first) imported ``verimirage.rewrite.cost``, whose package imports egglog, outside ``recheck``'s
    per-item guard: every plan look-up on the device raised, was reported as "search failed", and no partition was
    taken. Without the cost model the stored order serves (``--sort-plan`` / make_plan write it cheapest first)."""
    (tmp_path / "egglog.py").write_text("raise ModuleNotFoundError(\"No module named 'egglog'\")\n")
    code = textwrap.dedent("""
        import sys
        sys.path.insert(0, "benchmarks")
        import corpus_capture as cc
        import verimirage as vm
        items = ["not a mugraph", {"mugraph": "also not one", "certificate": "{}"}]
        assert cc.by_cost(items) == items
        g = vm.Graph()
        x = g.input("X", (4, 8), vm.float32)
        g.output(g.exp(x))
        served, why = cc.recheck(g, items, 2, {})
        assert served == [] and len(why) == 2, why
        assert "verimirage.rewrite" not in sys.modules
        print("ok")
    """)
    env = {"PYTHONPATH": f"{tmp_path}:{ROOT}", "PATH": "/usr/bin:/bin"}
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, cwd=ROOT, timeout=300)
    assert r.returncode == 0 and r.stdout.strip().endswith("ok"), r.stderr[-2000:]


def test_stored_plans_are_in_cost_order() -> None:
    """What a machine without egglog serves is the stored order: every committed plan keeps it cheapest first."""
    sys.path.insert(0, str(ROOT / "benchmarks"))
    import json

    import corpus_capture as cc

    for p in sorted((ROOT / "benchmarks/results/capture").glob("plan_*_fp16.json")):
        plan = json.loads(p.read_text())
        bad = [k for k, items in plan.items() if cc.by_cost(items) != items]
        assert not bad, f"{p.name}: {len(bad)} entries not cheapest first (run corpus_capture.py --sort-plan)"
