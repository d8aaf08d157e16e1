"""Run written test modules with pytest in a fresh process and read back each test's outcome."""

from __future__ import annotations

import os
import subprocess
import sys
import xml.etree.ElementTree as ET
from collections.abc import Sequence
from pathlib import Path


def run_pytest(
    modules: Sequence[str | Path], *, cwd: str | Path, pythonpath: Sequence[str | Path] = (),
    extra_args: Sequence[str] = (), timeout_s: float = 600.0,
) -> dict[str, str]:
    """Outcome (``passed``/``failed``/``skipped``) of every test of ``modules``, keyed ``"module::test"``.

    The key ``"__output__"`` holds the tail of pytest's output. ``pythonpath``
    is prepended to ``PYTHONPATH``; pytest and hypothesis settings of the
    calling process (``PYTEST_*``, ``HYPOTHESIS_*``) are not passed on.
    """
    cwd = Path(cwd)
    report = cwd / "vm_testing_report.xml"
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PYTEST", "HYPOTHESIS"))}
    env["PYTHONPATH"] = os.pathsep.join([*map(str, pythonpath), *filter(None, [os.environ.get("PYTHONPATH")])])
    proc = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", f"--junitxml={report}", "--rootdir", str(cwd),
         *extra_args, *map(str, modules)],
        cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout_s,
    )
    if not report.exists():
        raise RuntimeError(
            f"pytest wrote no report (exit {proc.returncode}):\n{proc.stdout[-3000:]}{proc.stderr[-3000:]}"
        )
    out: dict[str, str] = {}
    for case in ET.parse(report).getroot().iter("testcase"):
        mod = case.get("classname", "").rsplit(".", 1)[-1]
        status = "passed"
        for child in case:
            if child.tag in ("failure", "error"):
                status = "failed"
            elif child.tag == "skipped":
                status = "skipped"
        out[f"{mod}::{case.get('name')}"] = status
    out["__output__"] = proc.stdout[-6000:]
    return out
