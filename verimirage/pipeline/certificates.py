"""``vm.check_certificate``: the independent checker (:mod:`verimirage.smt.certificate`) joined with the code
generator that regenerates the Triton module's hash (:func:`verimirage.backend.tuning.triton_digest`).

The two packages are peers that import only the IR; this layer, above both, passes the one to the other. What a
certificate vouches for: the two programs' equality (the checker), and the Triton module the code generator makes
from the proved μGraph with :func:`~verimirage.backend.tuning.recommend`'s tiles in the default launch mode (its
``triton_source_sha256``). A module ``vm.compile`` generates in another launch mode (merged launches, PDL, last-block
combines, one persistent launch) is a function of the same μGraph and the mode, so it is checked by regenerating it
here for that mode (``compiled=`` or ``mode=``) and comparing with the module that runs; the certificate's schema, and
the checker process, are unchanged.
"""

from __future__ import annotations

import hashlib
import json
import threading
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from .. import checkcall
from ..ir.errors import GraphError
from ..smt import certificate as C
from ..smt.certificate import Certificate, ComposedCertificate
from ..smt.verdict import Check, Outcome, Unknown, Verdict

#: the longest μGraph text whose Triton module a check regenerates (characters): 25 times the largest committed
#: certificate's (layer_decode_bs1, about 10,000). The code generator's time grows faster than the text (0.75 MB of
#: elementwise ops took 50 s), and it runs in the calling process, so a longer text is not confirmed (a rejection).
MAX_REGENERATE_CHARS = 1 << 18


def _triton_digest(mugraph_text: str, mode: Mapping[str, Any] | str | None = None,
                   deadline: float = float("inf")) -> str:
    """The digest of ``mode``'s module of ``mugraph_text``, made on a thread given until ``deadline`` (monotonic):
    GraphError for a text over :data:`MAX_REGENERATE_CHARS`, TimeoutError past the deadline (the thread is left to
    finish: the size bound bounds its work)."""
    from ..backend.tuning import triton_digest  # (the code generator: no torch, no triton)

    if len(mugraph_text) > MAX_REGENERATE_CHARS:
        raise GraphError(f"the μGraph text has {len(mugraph_text):,} characters; the code generator regenerates a "
                         f"module for a check from at most {MAX_REGENERATE_CHARS:,} (MAX_REGENERATE_CHARS)")
    box: list[Any] = []

    def run() -> None:
        try:
            box.append(triton_digest(mugraph_text, mode))
        except Exception as e:  # (raised again in the caller's thread)
            box.append(e)

    worker = threading.Thread(target=run, name="vm-regenerate", daemon=True)
    worker.start()
    worker.join(max(0.0, deadline - time.monotonic()))
    if not box:
        raise TimeoutError("regenerating the module ran past the check's time limit ($VERIMIRAGE_CHECK_SECONDS)")
    if isinstance(box[0], Exception):
        raise box[0]
    return str(box[0])


def _reject(why: str, v: Verdict) -> Unknown:
    return C._reject(why, v.evidence)


def check_certificate(
    cert: Certificate | ComposedCertificate | str | Path, *, triton_source: str | None = None,
    timeout_s: float = 10.0, memory_mb: float | None = None, wall_s: float | None = None, isolate: bool = True,
    triton: bool = True, compiled: Any = None, mode: Mapping[str, Any] | str | None = None,
    module_source: str | None = None,
) -> Verdict:
    """Independently re-check a certificate (a :class:`Certificate` or the path of its JSON file); Proved,
    or Unknown naming the first mismatch (see :mod:`verimirage.smt.certificate`).

    ``isolate`` (the default): in a child process that cannot import the verifier's modules, capped at
    ``memory_mb`` MiB of address space (default ``$VERIMIRAGE_CHECK_MEMORY_MB`` or 8192) and ``wall_s``
    seconds (default ``$VERIMIRAGE_CHECK_SECONDS`` or 1800); a blow-up is a rejection. ``timeout_s``: per Z3
    query. ``triton`` (the default): when the certificate records a Triton hash, regenerate the module from
    the μGraph with the backend's code generator and compare; ``triton_source``: a source that must match it
    too.

    The module that runs: ``compiled`` (a :class:`~verimirage.backend.runtime.CompiledProgram`) must run the module
    the code generator makes from the certificate's μGraph in the program's launch mode (``launch_mode``) with
    recommend's tiles: that module is regenerated here and its sha256 compared with the program's source (a program
    compiled with a config's tiles is rejected: no certificate vouches for its text). ``mode`` (a launch mode,
    :func:`verimirage.backend.tuning.launch_mode`; ``compiled``'s when given): regenerate that mode's module and
    record its digest in the evidence (``triton-module``); ``module_source``: a module text that must equal it.
    Regenerating runs in this process, so it is bounded: a μGraph text over :data:`MAX_REGENERATE_CHARS` is not
    regenerated, and one regeneration past ``wall_s`` is abandoned; either is a rejection.
    Raises FileNotFoundError for a path that names no file and :class:`CertificateError` for an
    unreadable file or text that is not a JSON object.
    """
    if compiled is not None:
        if mode is not None or module_source is not None:
            raise ValueError("check_certificate: give compiled= or mode=/module_source=, not both")
        mode, module_source = compiled.launch_mode, compiled.source
    if mode is None and module_source is not None:
        raise ValueError("check_certificate: module_source= needs mode= (the launch mode it was generated for)")
    name = None if mode is None else _mode_name(mode)  # (an unknown option: ValueError before any check)
    # (regenerating counts too)
    deadline = time.monotonic() + checkcall.limit(wall_s, checkcall.SECONDS_ENV, checkcall.DEFAULT_SECONDS)
    if name is not None and isinstance(cert, (str, Path)):
        # read the file once: the mode's module must come from the μGraph the checker checks (a second read, after
        # the check, took the μGraph of whatever the file held by then)
        from ..smt.certify import read_certificate

        text = checkcall.text_of(cert)
        try:
            cert = read_certificate(text)
        except (ValueError, TypeError) as e:
            return C._reject(str(e))
    made: list[Any] = []  # the mode's digest (or why it cannot be made) and its seconds, made while the child checks

    def regenerate(mugraph_text: str) -> str:
        if mode is not None and not made:
            made[:] = _timed(mugraph_text, mode, deadline)
        return _triton_digest(mugraph_text, None, deadline)

    v = checkcall.check_certificate(cert, triton_source=triton_source, timeout_s=timeout_s, memory_mb=memory_mb,
                            wall_s=wall_s, isolate=isolate, triton=triton, regenerate=regenerate)
    if mode is None or name is None or not v.proved:
        return v
    if compiled is not None and not compiled.tuned_tiles:
        return _reject("the compiled program's tiles come from a launch config (given, profiled or fitted to shared "
                       "memory), not recommend's: no certificate vouches for its module", v)
    if not made:  # (a certificate object: the one checked; see above)
        made[:] = _timed(json.loads(cert.to_json()).get("mugraph_text"), mode, deadline)  # type: ignore[union-attr]
    d, seconds = made
    if isinstance(d, Exception):
        return _reject(f"the Triton module for launch mode {name} cannot be regenerated ({type(d).__name__}: {d})", v)
    if module_source is not None and hashlib.sha256(module_source.encode()).hexdigest() != d:
        got = hashlib.sha256(module_source.encode()).hexdigest()
        return _reject(f"the module that runs (sha256 {got[:16]}...) is not the one generated from the certificate's "
                       f"μGraph in launch mode {name} (sha256 {d[:16]}...)", v)
    return C.confirmed(v, f"; Triton module for launch mode {name} regenerated"
                       + (" and matched" if module_source is not None else ""),
                       Check("triton-module", Outcome.PROVED, (("mode", name), ("sha256", d)), seconds))


def _mode_name(mode: Mapping[str, Any] | str) -> str:
    from ..backend.tuning import mode_name

    return mode_name(mode)


def _timed(mugraph_text: Any, mode: Mapping[str, Any] | str, deadline: float) -> list[Any]:
    """``[digest or the exception, seconds]`` for ``mode``'s module of ``mugraph_text`` (made by ``deadline``)."""
    t0 = time.perf_counter()
    d: str | Exception
    try:
        if not isinstance(mugraph_text, str):
            raise ValueError("the certificate has no mugraph_text")
        d = _triton_digest(mugraph_text, mode, deadline)
    except Exception as e:  # the generator cannot express it: the module is not confirmed
        d = e
    return [d, time.perf_counter() - t0]
