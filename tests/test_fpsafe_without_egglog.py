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
