"""The calling side of a certificate check: start the checker process, send it the certificate, wait for its answer.

Not on the trusted path (docs/architecture.md, "What a Proved depends on"): nothing here can make a Proved. The
checker process (:mod:`verimirage.checkproc`'s ``_CHILD``, then ``smt.certificate._child_main``) writes its verdict
with the sha256 of the certificate text it checked; :func:`verimirage.smt.certificate.verdict_of` (trusted) reads it
and rejects an answer about any other text; a confirmation made here (the Triton module's hash regenerated and
compared) goes through :func:`verimirage.smt.certificate.confirmed`, which keeps a verdict that is not Proved as it
is. A failure here (a process that does not start, a time limit, a lost request) is a rejection or an error, never
a Proved.

Standard library only at import: ``verimirage check-cert`` calls :func:`prestart` first, so that the child imports
its modules while the caller imports its own.
"""

from __future__ import annotations

import atexit
import json
import os
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from .checkproc import _CHILD, REFUSED

if TYPE_CHECKING:
    from .smt.certificate import Certificate, ComposedCertificate
    from .smt.verdict import Verdict

#: environment variables: the checker process's address-space cap (MiB) and wall-clock limit (s)
MEMORY_ENV, SECONDS_ENV = "VERIMIRAGE_CHECK_MEMORY_MB", "VERIMIRAGE_CHECK_SECONDS"
DEFAULT_MEMORY_MB, DEFAULT_SECONDS = 8192, 1800.0
#: the largest certificate file read (16 MiB, ~290x the largest committed one: a larger file is rejected unread, its
#: JSON would take the caller's memory and time)
MAX_CERT_BYTES = 1 << 24

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


def limit(value: float | None, env: str, default: float) -> float:
    """``value``, else the number in ``$env``, else ``default`` (GraphError for a variable that is no number)."""
    from .ir.errors import GraphError

    if value is not None:
        return float(value)
    raw = os.environ.get(env, "")
    try:
        return float(raw) if raw else default
    except ValueError:
        raise GraphError(f"${env}={raw!r}; expected a number") from None


def text_of(cert: Certificate | ComposedCertificate | str | Path) -> str:
    """The JSON text of a certificate object or file (FileNotFoundError for a path naming no file, CertificateError
    for one that cannot be read as a JSON object)."""
    from .smt.certificate import Certificate, CertificateError, ComposedCertificate

    if isinstance(cert, (Certificate, ComposedCertificate)):
        return cert.to_json()
    if not isinstance(cert, (str, Path)):
        raise CertificateError(f"certificate: {type(cert).__name__}; expected a Certificate or a path")
    if not os.path.isfile(cert):  # a typo (or JSON text, a name too long to stat) is not a rejected certificate
        raise FileNotFoundError(f"check_certificate: no certificate file at {str(cert)[:200]!r}")
    try:
        with open(cert, "rb") as f:  # (a byte more than the cap at most: a larger file is not read further)
            raw = f.read(MAX_CERT_BYTES + 1)
        if len(raw) > MAX_CERT_BYTES:
            raise OSError(f"larger than {MAX_CERT_BYTES:,} bytes, the most a certificate file may hold")
        text = raw.decode()
    except (OSError, UnicodeDecodeError) as e:
        raise CertificateError(f"certificate {str(cert)!r}: cannot read it ({e})") from None
    try:
        d = json.loads(text)
    except (ValueError, RecursionError) as e:  # (nesting too deep, an int too long: not JSON we read either)
        raise CertificateError(f"certificate {str(cert)!r}: not JSON ({type(e).__name__}: {str(e)[:200]})") from None
    if not isinstance(d, dict):
        raise CertificateError(f"certificate {str(cert)!r}: expected a JSON object, got {type(d).__name__}")
    return text


def isolated(text: str, known: frozenset[str], timeout_s: float, memory_mb: float, wall_s: float,
             meanwhile: Callable[[], None] = lambda: None) -> Verdict:
    """:func:`~verimirage.smt.certificate.check_text` in a checker process capped at ``memory_mb`` MiB and ``wall_s``
    seconds; ``meanwhile`` runs in this process while the child checks."""
    from .smt.certificate import _reject, verdict_of

    req = json.dumps({"certificate": text, "known_rules": sorted(known), "timeout_s": timeout_s,
                      "memory_mb": int(memory_mb)})
    t0 = time.monotonic()
    proc, stdin = take()
    send(stdin, req)
    try:
        meanwhile()
        stdout, stderr = proc.communicate(timeout=max(0.0, wall_s - (time.monotonic() - t0)))
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.communicate()
        return _reject(f"the check ran past its time limit ({wall_s:g} s, ${SECONDS_ENV})")
    except BaseException:
        proc.kill()
        proc.communicate()
        raise
    v = verdict_of(stdout, text)
    if v is None:
        why = (stderr.strip().splitlines() or ["no output"])[-1][:300]
        return _reject(f"the checker process failed (exit {proc.returncode}, memory cap {memory_mb:g} MiB, "
                       f"${MEMORY_ENV}): {why}")
    return v


def check_certificate(
    cert: Certificate | ComposedCertificate | str | Path, *, triton_source: str | None = None, timeout_s: float = 10.0,
    memory_mb: float | None = None, wall_s: float | None = None, isolate: bool = True, triton: bool = True,
    regenerate: Callable[[str], str] | None = None,
) -> Verdict:
    """Independently re-check a certificate: the check :func:`verimirage.pipeline.certificates.check_certificate`
    runs (see there for the arguments), with ``regenerate`` (μGraph text -> the sha256 of its Triton module: the
    backend's :func:`~verimirage.backend.tuning.triton_digest`, which that function passes; ``smt/`` does not import
    the backend) to confirm a recorded Triton hash; without one the hash is not confirmed: a rejection."""
    from .ir.errors import GraphError
    from .smt.certificate import _Doc, _reject, check_text, confirmed, sha256
    from .smt.certify import known_rules
    from .smt.verdict import Check, Outcome

    text = text_of(cert)
    try:
        _Doc.from_json(text)  # (each field's type, named: the checker process only compares it with its re-derivation)
    except (ValueError, TypeError) as e:
        return _reject(str(e))
    h = json.loads(text).get("triton_source_sha256")
    made: list[Any] = []  # the Triton digest (or why it cannot be made) and its seconds, made while the child checks

    def digest() -> None:
        t0 = time.perf_counter()
        d: str | Exception
        try:
            if regenerate is None:
                raise GraphError("no code generator given (vm.check_certificate passes the backend's)")
            d = regenerate(json.loads(text)["mugraph_text"])
        except Exception as e:  # the generator cannot express it (or is absent): the hash is not confirmed
            d = e
        made[:] = [d, time.perf_counter() - t0]

    want_digest = triton and h is not None
    if isolate:
        v = isolated(text, known_rules(), timeout_s, limit(memory_mb, MEMORY_ENV, DEFAULT_MEMORY_MB),
                     limit(wall_s, SECONDS_ENV, DEFAULT_SECONDS), digest if want_digest else lambda: None)
    else:
        v = check_text(text, known_rules(), timeout_s)
    if not v.proved:
        return v
    if h is None:
        return v if triton_source is None else _reject("a Triton source was given but the certificate records no "
                                                       "hash", v.evidence)
    if triton_source is not None and sha256(triton_source) != h:
        return _reject("the Triton source does not match the certificate's hash", v.evidence)
    if not want_digest:
        return v
    if not made:
        digest()
    d, seconds = made
    if isinstance(d, Exception):
        return _reject(f"the Triton module cannot be regenerated ({type(d).__name__}: {d})", v.evidence)
    if d != h:
        return _reject(f"the Triton module generated from the μGraph has sha256 {d[:16]}..., not the "
                       f"certificate's {h[:16]}...", v.evidence)
    return confirmed(v, "; Triton module hash regenerated", Check("triton-hash", Outcome.PROVED, (("sha256", h),),
                                                                   seconds))
