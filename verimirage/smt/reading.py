"""What a verdict's readers use and no check does: the bound a verdict states, the checks that caught a pair, a
summary, a check's parameter by name; and a certificate's reading with its fields' types checked (naming what is
wrong), its writing and its files.

Importing :mod:`verimirage.smt` puts these on :class:`~.verdict.Verdict` and :class:`~.verdict.Check` (as
:mod:`verimirage.ir.builders` puts the building methods on the graph classes). The certificate checker's process
never imports them: a ``Proved`` depends on none of them (README, "Trusted path").
"""

from __future__ import annotations

import json
import re
from dataclasses import asdict
from pathlib import Path
from typing import Any

from .certificate import COMPOSED_SCHEMA, SCHEMA, Certificate, ComposedCertificate, _Doc
from .verdict import Check, Outcome, Verdict


class DocMethods:
    """A certificate's reading with its fields' types checked, writing and file reading (installed on both kinds of
    certificate)."""

    @classmethod
    def from_json(cls, text: str) -> Any:
        """Read a certificate of this kind (called on ``_Doc``: of the kind its schema names) from JSON text;
        ValueError naming what is wrong (each field's type checked: the checker's own reading, ``certificate._read``,
        leaves that to its comparisons)."""
        try:
            d = json.loads(text)
        except json.JSONDecodeError as e:
            raise ValueError(f"certificate: not JSON ({e})") from None
        if not isinstance(d, dict):
            raise ValueError("certificate: expected a JSON object")
        kind = (ComposedCertificate if d.get("schema") == COMPOSED_SCHEMA else Certificate) if cls is _Doc else cls
        fields = kind.__dataclass_fields__  # type: ignore[attr-defined]
        if d.get("schema") != fields["schema"].default:
            raise ValueError(f"certificate: unknown schema {d.get('schema')!r}; expected {fields['schema'].default!r}")
        extra = sorted(set(d) - set(fields))
        missing = sorted(n for n, f in fields.items() if n not in d and f.default is f.default_factory)  # (no default)
        if extra or missing:
            raise ValueError(f"certificate: unknown fields {extra}, missing fields {missing}")
        bad = next((n for n, f in fields.items() if n in d and not _typed(d[n], f.type)), None)
        if bad is not None:
            raise ValueError(f"certificate: field {bad!r}: got {json.dumps(d[bad])[:60]}; expected {fields[bad].type}")
        if d.get("triton_source_sha256") is not None and not re.fullmatch(r"[0-9a-f]{64}", d["triton_source_sha256"]):
            raise ValueError("certificate: triton_source_sha256 is not a sha256 hex digest")
        for i, sub in enumerate(d["certificates"] if kind is ComposedCertificate else ()):  # (read the same way)
            try:
                if sub.get("schema") == SCHEMA:  # (another schema: the checker says which it expects)
                    Certificate.from_json(json.dumps(sub))  # type: ignore[attr-defined]
            except ValueError as e:
                raise ValueError(f"sub-certificate {i}: {e}") from None
        return kind(**d)

    def to_json(self) -> str:
        """The JSON text."""
        return json.dumps(asdict(self), indent=1, sort_keys=True)  # type: ignore[call-overload]

    def save(self, path: str | Path) -> None:
        """Write the certificate to ``path`` (JSON)."""
        Path(path).write_text(self.to_json())

    @classmethod
    def load(cls, path: str | Path) -> Any:
        """Read a certificate file."""
        return cls.from_json(Path(path).read_text())


def _typed(v: Any, t: str) -> bool:
    """Whether JSON value ``v`` has the type annotation ``t`` (str, list[...], dict[str, ...], Any, ``| None``)."""
    if (t.endswith(" | None") and v is None) or t == "Any":
        return True
    outer, _, inner = t.removesuffix(" | None").partition("[")
    if not isinstance(v, {"list": list, "dict": dict}.get(outer, str)):
        return False
    items = v.values() if isinstance(v, dict) else v if isinstance(v, list) else ()  # (JSON's keys are strings)
    return all(_typed(x, inner[:-1].removeprefix("str, ")) for x in items)


class CheckMethods:
    """A check's conveniences (installed on :class:`~.verdict.Check`)."""

    params: tuple[tuple[str, Any], ...]

    def param(self, key: str, default: Any = None) -> Any:
        """The parameter ``key`` (or ``default``)."""
        for k, v in self.params:
            if k == key:
                return v
        return default


class VerdictMethods:
    """A verdict's conveniences (installed on :class:`~.verdict.Verdict`)."""

    reason: str
    evidence: tuple[Check, ...]

    @property
    def false_accept_bound(self) -> float | None:
        """The probability bound on accepting a wrong pair that the finite-field check states, if it ran
        and states one (None where its record says it states none: programs with max / oracle ops, or
        element-wise applications too many for the field; its ``false_accept_bound`` parameter is then
        the per-node model's figure only)."""
        for c in self.evidence:
            if any(k == "stated_bound" for k, _ in c.params):
                b = c.param("stated_bound")
                return None if b is None else float(b)
            b = c.param("false_accept_bound")
            if b is not None:
                return float(b)
        return None

    def caught_by(self) -> tuple[str, ...]:
        """Names of the checks whose outcome was not ``proved``."""
        return tuple(c.name for c in self.evidence if c.outcome != Outcome.PROVED)

    def summary(self) -> str:
        """One line per check."""
        lines = [f"{type(self).__name__}: {self.reason}"]
        for c in self.evidence:
            lines.append(f"  {c.name}: {c.outcome} ({c.seconds:.3f}s) {c.detail}".rstrip())
        return "\n".join(lines)


def install() -> None:
    """Put the conveniences on :class:`~.verdict.Check` and :class:`~.verdict.Verdict` (done on import)."""
    for src, dst in ((CheckMethods, Check), (VerdictMethods, Verdict), (DocMethods, _Doc)):
        for name, fn in vars(src).items():
            if not name.startswith("__"):
                setattr(dst, name, fn)


install()

__all__ = ["CheckMethods", "DocMethods", "VerdictMethods", "install"]
