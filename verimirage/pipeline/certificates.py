"""``vm.check_certificate``: the independent checker (:mod:`verimirage.smt.certificate`) joined with the code
generator that regenerates the Triton module's hash (:func:`verimirage.backend.tuning.triton_digest`).

The two packages are peers that import only the IR; this layer, above both, passes the one to the other.
"""

from __future__ import annotations

from pathlib import Path

from ..smt import certificate as C
from ..smt.certificate import Certificate, ComposedCertificate
from ..smt.verdict import Verdict


def _triton_digest(mugraph_text: str) -> str:
    from ..backend.tuning import triton_digest  # (the code generator: no torch, no triton)

    return triton_digest(mugraph_text)


def check_certificate(
    cert: Certificate | ComposedCertificate | str | Path, *, triton_source: str | None = None,
    timeout_s: float = 10.0, memory_mb: float | None = None, wall_s: float | None = None, isolate: bool = True,
    triton: bool = True,
) -> Verdict:
    """Independently re-check a certificate (a :class:`Certificate` or the path of its JSON file); Proved,
    or Unknown naming the first mismatch (see :mod:`verimirage.smt.certificate`).

    ``isolate`` (the default): in a child process that cannot import the verifier's modules, capped at
    ``memory_mb`` MiB of address space (default ``$VERIMIRAGE_CHECK_MEMORY_MB`` or 8192) and ``wall_s``
    seconds (default ``$VERIMIRAGE_CHECK_SECONDS`` or 1800); a blow-up is a rejection. ``timeout_s``: per Z3
    query. ``triton`` (the default): when the certificate records a Triton hash, regenerate the module from
    the μGraph with the backend's code generator and compare; ``triton_source``: a source that must match it
    too. Raises FileNotFoundError for a path that names no file and :class:`CertificateError` for an
    unreadable file or text that is not a JSON object.
    """
    return C.check_certificate(cert, triton_source=triton_source, timeout_s=timeout_s, memory_mb=memory_mb,
                               wall_s=wall_s, isolate=isolate, triton=triton, regenerate=_triton_digest)
