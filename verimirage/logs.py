"""Logging set-up for applications (the CLI, the examples) and egglog's quiet default.

The library itself only ever creates loggers under ``verimirage.*``; it never
configures the root logger. Two things live here:

* :func:`quiet_egglog` — called when verimirage first imports egglog: egglog's
  Rust core logs every command at INFO (multi-kilobyte s-expressions), so its
  loggers (``egglog``, ``egglog.*``) are set to WARNING, unless the user set a
  level on them already or asked for it in ``VERIMIRAGE_LOG``.
* :func:`configure` — for applications: a stderr handler on the ``verimirage``
  logger (and on ``egglog`` when asked), with the level from ``-v`` or
  ``VERIMIRAGE_LOG``.

``VERIMIRAGE_LOG`` is a comma-separated list of ``LEVEL`` (the ``verimirage``
logger) or ``LOGGER=LEVEL`` entries, e.g. ``VERIMIRAGE_LOG=info`` or
``VERIMIRAGE_LOG=debug,egglog=info``.
"""

from __future__ import annotations

import logging
import os
import sys

ENV = "VERIMIRAGE_LOG"

#: The loggers egglog's bindings log through (pyo3-log names them after the Rust module path).
EGGLOG_LOGGERS = ("egglog",)


def _level(text: str) -> int:
    t = text.strip().upper()
    if t.isdigit():
        return int(t)
    lv = logging.getLevelName(t)
    if not isinstance(lv, int):
        raise ValueError(f"{ENV}: unknown level {text!r}; expected debug, info, warning, error or a number")
    return lv


def env_levels(value: str | None = None) -> dict[str, int]:
    """The levels ``VERIMIRAGE_LOG`` (or ``value``) asks for, by logger name (``verimirage`` for a bare level)."""
    value = os.environ.get(ENV, "") if value is None else value
    out: dict[str, int] = {}
    for part in value.split(","):
        part = part.strip()
        if not part:
            continue
        name, sep, lv = part.rpartition("=")
        out[name.strip() if sep else "verimirage"] = _level(lv)
    return out


def quiet_egglog() -> None:
    """Set egglog's loggers to WARNING unless the user set their level or asked for one in ``VERIMIRAGE_LOG``."""
    try:
        asked = env_levels()
    except ValueError:
        asked = {}
    for name in EGGLOG_LOGGERS:
        lg = logging.getLogger(name)
        if name in asked:
            lg.setLevel(asked[name])
        elif lg.level == logging.NOTSET:
            lg.setLevel(logging.WARNING)


def configure(verbosity: int = 0, *, stream: object = None) -> None:
    """Application logging: a handler on ``verimirage`` (and egglog if asked); never the root logger.

    ``verbosity`` 0: warnings; 1 (``-v``): verimirage at INFO; 2 (``-vv``): verimirage at DEBUG and egglog at
    INFO. ``VERIMIRAGE_LOG`` entries override these levels. Calling it again replaces the handler.
    """
    levels = {"verimirage": logging.WARNING if verbosity <= 0 else logging.INFO if verbosity == 1 else logging.DEBUG}
    if verbosity >= 2:
        levels.update(dict.fromkeys(EGGLOG_LOGGERS, logging.INFO))
    levels.update(env_levels())
    handler = logging.StreamHandler(stream or sys.stderr)  # type: ignore[arg-type]
    handler.setFormatter(logging.Formatter("%(levelname)s %(name)s: %(message)s"))
    handler.set_name("verimirage.logs")
    for name in {"verimirage", *EGGLOG_LOGGERS, *levels}:
        lg = logging.getLogger(name)
        for h in list(lg.handlers):
            if h.get_name() == "verimirage.logs":
                lg.removeHandler(h)
        if name in levels:
            lg.setLevel(levels[name])
            lg.addHandler(handler)
            lg.propagate = False
        elif name in EGGLOG_LOGGERS:
            lg.setLevel(logging.WARNING)
