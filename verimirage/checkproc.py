"""The certificate checker's process: started by the standard library alone, so a caller can start it first.

:func:`verimirage.smt.certificate.check_certificate` checks in a child process that cannot import the
verifier's modules (:data:`REFUSED`); it imports the checker's modules, then reads its request on stdin,
caps its memory and writes its verdict as JSON (``certificate._child_main``). :func:`take` gives a process
for one check; :func:`prestart` starts one ahead of time (``verimirage check-cert`` does, before it imports
numpy and the rest), so that the child imports its modules while the caller imports its own.
"""

from __future__ import annotations

import atexit
import os
import subprocess
import sys
import threading
from pathlib import Path

#: modules the checker process refuses to import (the verifier's fast paths, the search, the backend)
REFUSED = ("verimirage.smt.ff", "verimirage.smt.verify", "verimirage.smt.prune",
           "verimirage.rewrite", "verimirage.backend", "verimirage.pipeline", "verimirage.testing", "torch", "triton",
           "egglog", "verimirage.ir.builders", "verimirage.ir.reference", "verimirage.ir.opfacts",
           "verimirage.ir.serial", "verimirage.ir.dot", "verimirage.ir.svg", "verimirage.smt.certify",
           "verimirage.smt.axioms", "verimirage.smt.budget", "verimirage.smt.reading", "verimirage.integrations",
           "verimirage.benchmarks")

#: the checker process's code (argv: this checkout's root, then the caller's path). The packages ``verimirage``,
#: ``verimirage.ir`` and ``verimirage.smt`` are bare modules there: their ``__init__`` files (the public names'
#: lazy loaders and re-exports) never run in it; the checker imports the modules it uses by their full names.
_CHILD = """
import os, sys, types
sys.path[:0] = sys.argv[1:]
for pkg in ("verimirage", "verimirage.ir", "verimirage.smt"):
    sys.modules[pkg] = types.ModuleType(pkg)
    sys.modules[pkg].__path__ = [os.path.join(sys.argv[1], *pkg.split("."))]
class _Refuse:
    def find_spec(self, name, path=None, target=None):
        if any(name == r or name.startswith(r + ".") for r in {refused!r}):
            raise ImportError("the certificate checker does not use " + name)
        return None
sys.meta_path.insert(0, _Refuse())
from verimirage.smt.certificate import _child_main
_child_main()
sys.stdout.flush()
sys.stderr.flush()
os._exit(0)  # (the verdict is written: no interpreter teardown, 0.1-0.2 s after a check of big arrays)
"""

#: glibc malloc settings of the checker process (unless set already): big arrays from the heap, kept for reuse,
#: instead of a fresh mapping (and its page faults) per array (the gqa_bs1 check: 3.1 -> 0.8 s of system time),
#: one heap for every thread (a trial thread's own arena gave back and faulted in its arrays anew: 27k -> 21k
#: page faults, system time 0.3 -> 0.14 s in the gqa_bs1 check)
_MALLOC = {"MALLOC_MMAP_THRESHOLD_": str(1 << 30), "MALLOC_TRIM_THRESHOLD_": str(1 << 32),
           "MALLOC_TOP_PAD_": str(1 << 28), "MALLOC_ARENA_MAX": "1"}

#: a process started by :func:`prestart`, not yet taken: (process, write end of its stdin)
_spare: list[tuple[subprocess.Popen[str], int]] = []


def start() -> tuple[subprocess.Popen[str], int]:
    """A new checker process (importing the checker's modules) and the write end of its stdin (see :func:`send`)."""
    root = str(Path(__file__).resolve().parents[1])
    env = {**_MALLOC, **os.environ, "OPENBLAS_NUM_THREADS": "1", "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}
    # isolated, without site (~45 ms less start-up): the path is this checkout's root, then this process's path
    path = [root, *(p for p in sys.path if os.path.isabs(p) and p != root)]
    r, w = os.pipe()
    try:
        proc = subprocess.Popen([sys.executable, "-I", "-S", "-c", _CHILD.format(refused=REFUSED), *path], stdin=r,
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env, cwd=root)
    except BaseException:
        os.close(w)
        raise
    finally:
        os.close(r)
    return proc, w


def prestart() -> None:
    """Start a checker process now, for the next :func:`take` of this process (ended at exit if not taken)."""
    if not _spare:
        _spare.append(start())
        atexit.register(_drop_spare)


def _drop_spare() -> None:
    while _spare:
        proc, w = _spare.pop()
        os.close(w)
        proc.kill()
        proc.communicate()


def take() -> tuple[subprocess.Popen[str], int]:
    """A checker process for one check: the one :func:`prestart` started, else a new one."""
    try:
        return _spare.pop()  # (atomic: two threads never take the same one)
    except IndexError:
        return start()


def send(w: int, request: str) -> None:
    """Write ``request`` to the checker's stdin (write end ``w``) and close it, on a thread: the child reads it
    once its imports are done, while the caller works on."""

    def write() -> None:
        try:
            with open(w, "w") as f:
                f.write(request)
        except OSError:  # (the child ended early: its missing answer and exit status say why)
            pass

    threading.Thread(target=write, name="vm-checker-request", daemon=True).start()
