"""The progress display of long pipeline runs (search, synthesis, sweeps): a rich bar on stderr when asked
or on a terminal, a log line per step always."""

from __future__ import annotations

import logging
import sys
from typing import Any

log = logging.getLogger("verimirage.pipeline")


class Progress:
    """A context manager showing the steps of ``what``: :meth:`phase` advances a bar of ``total`` steps,
    :meth:`update` sets its description (and completed/total). ``enabled=None`` means "when stderr is a
    terminal"; without rich installed only the log lines remain. The bar is on stderr, so stdout stays the
    report."""

    def __init__(self, enabled: bool | None, what: str, total: int | None = None) -> None:
        self.what, self.total = what, total
        self.bar: Any = None
        self.task: Any = None
        if enabled if enabled is not None else sys.stderr.isatty():
            try:
                from rich.console import Console
                from rich.progress import Progress as Bar

                self.bar = Bar(console=Console(stderr=True), transient=True)
            except ImportError:  # pragma: no cover
                self.bar = None

    def __enter__(self) -> Progress:
        if self.bar is not None:
            self.bar.__enter__()
            self.task = self.bar.add_task(self.what, total=self.total)
        return self

    def __exit__(self, *exc: Any) -> None:
        if self.bar is not None:
            self.bar.__exit__(*exc)

    def phase(self, name: str) -> None:
        """One step done, now ``name``."""
        log.info("%s: %s", self.what, name)
        if self.bar is not None:
            self.bar.update(self.task, advance=1, description=name)

    def update(self, msg: str, completed: int | None = None, total: int | None = None) -> None:
        """Say ``msg`` (and how far: ``completed`` of ``total``)."""
        log.info("%s: %s", self.what, msg)
        if self.bar is not None:
            self.bar.update(self.task, description=f"{self.what}: {msg}", completed=completed, total=total)
