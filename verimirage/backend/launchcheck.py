"""A static check of a generated module's launch ordering under programmatic dependent launch (PDL).

Triton's interpreter runs one launch at a time, so it never shows a race between launches; on a GPU, a PDL launch
(``launch_pdl=True``) may start while the launch before it still runs, and only ``gdc_wait()`` (``griddepcontrol.
wait``) orders it after that launch's completion and memory. :func:`pdl_hazards` reads a module's text (nothing of
codegen's own bookkeeping: the ``forward`` function's allocations, views and launch calls, and each launched
kernel's body) and lists what would let a launch read or write memory out of order:

* a launch without exactly one ``gdc_wait()`` at the top level of its body (every block runs it, unconditionally):
  a launch's completion must imply its predecessor's, so that one wait orders a launch after *every* earlier one;
* a ``return``, store, atomic or call of another kernel function (other than its L2-prefetch function) before the
  wait;
* before the wait, any mention of a pointer that is not one of the program's inputs (a buffer another launch of
  the program writes, the counters): the early loop and the prefetches may read only what no running kernel writes;
* ``gdc_launch_dependents()`` or a load before the wait in the program's first launch (a later launch could then
  start, or the first one read, before kernels outside the program, which may write its inputs, have completed);
* a program input, or a buffer written by another launch, among a launch's outputs (every launch writes only
  buffers of its own), and a launch that reads what it writes (but a last-block launch's partials).

The conditions are those under which PDL is sound for the program whatever the timing; ``[]`` means none failed.
"""

from __future__ import annotations

import re

__all__ = ["pdl_hazards"]

_IDENT = re.compile(r"[A-Za-z_]\w*")


def _split_args(text: str) -> list[str]:
    """The top-level comma-separated parts of an argument list's text."""
    parts, depth, cur = [], 0, ""
    for ch in text:
        if ch in "([{":
            depth += 1
        elif ch in ")]}":
            depth -= 1
        if ch == "," and depth == 0:
            parts.append(cur.strip())
            cur = ""
        else:
            cur += ch
    if cur.strip():
        parts.append(cur.strip())
    return parts


def _functions(src: str) -> dict[str, tuple[list[str], list[str]]]:
    """The module's ``@triton.jit`` functions: name -> (parameter names, body lines)."""
    out: dict[str, tuple[list[str], list[str]]] = {}
    lines = src.splitlines()
    for i, ln in enumerate(lines):
        if ln != "@triton.jit" or i + 1 >= len(lines):
            continue
        m = re.match(r"def (\w+)\((.*)\):$", lines[i + 1])
        if m is None:
            continue
        body = []
        for b in lines[i + 2:]:
            if b and not b.startswith(" "):
                break
            body.append(b)
        out[m.group(1)] = (_split_args(m.group(2)), body)
    return out


def _launches(src: str) -> tuple[list[str], dict[str, str], list[tuple[str, list[str]]]]:
    """``forward``'s inputs, each variable's base (views followed to the tensor whose memory they are) and its
    launches: (kernel name, argument texts) in order."""
    lines = src.splitlines()
    start = next(i for i, ln in enumerate(lines) if ln.startswith("def forward("))
    inputs = _split_args(lines[start][len("def forward("):-2])
    base: dict[str, str] = {x: x for x in inputs}
    launches: list[tuple[str, list[str]]] = []
    for ln in lines[start + 1:]:
        s = ln.strip()
        if m := re.match(r"(\w+) = (\w+)\.view\(", s):
            base[m.group(1)] = base.get(m.group(2), m.group(2))
        elif m := re.match(r"(\w+) = (torch\.empty|_vm_counters)\(", s):
            base[m.group(1)] = m.group(1)
        elif m := re.match(r"(\w+)\[[^\]]*\]\((.*)\)$", s):
            args = [a for a in _split_args(m.group(2)) if not a.startswith("**")]
            launches.append((m.group(1), args))
    return inputs, base, launches


def _mentions(lines: list[str]) -> set[str]:
    return {w for ln in lines for w in _IDENT.findall(ln.split("#", 1)[0])}


def pdl_hazards(src: str) -> list[str]:
    """The launch-ordering hazards of generated module text ``src`` (see the module's docstring); ``[]`` when none.
    A module generated without PDL (no ``gdc_wait`` imported) is checked only for its launches' outputs."""
    fns = _functions(src)
    inputs, base, launches = _launches(src)
    pdl = "import gdc_launch_dependents, gdc_wait" in src
    found: list[str] = []
    written: dict[str, str] = {}
    for li, (kname, args) in enumerate(launches):
        if kname not in fns:
            found.append(f"{kname}: launched but not defined")
            continue
        params, body = fns[kname]
        if len(params) != len(args):
            found.append(f"{kname}: {len(params)} parameters, launched with {len(args)} arguments")
            continue
        bound = dict(zip(params, args, strict=True))
        kind: dict[str, str] = {}  # pointer parameter -> "in" / "buf" / "ctr"
        for p, a in bound.items():
            if not p.endswith("_ptr"):
                continue
            b = base.get(a, a)
            kind[p] = "in" if b in inputs else ("ctr" if b == "ctr" else "buf")
        outs = [p for p in kind if re.match(r"(m\d+_)?o\d+_ptr$", p)]
        reads = [p for p in kind if p not in outs and kind[p] != "ctr"]
        counted = "ctr_ptr" in kind
        for p in outs:
            b = base.get(bound[p], bound[p])
            if kind[p] != "buf":
                found.append(f"{kname}: writes {bound[p]}, which is {'an input' if b in inputs else kind[p]}")
            elif b in written and written[b] != kname:
                found.append(f"{kname}: writes {b}, which {written[b]} writes too")
            written[b] = kname
            if not counted and any(base.get(bound[r], bound[r]) == b for r in reads):
                found.append(f"{kname}: reads {b}, which it writes")
        if not pdl:
            continue
        top = [i for i, ln in enumerate(body) if ln == "    gdc_wait()"]
        if sum("gdc_wait()" in ln for ln in body) != 1 or len(top) != 1:
            found.append(f"{kname}: {sum('gdc_wait()' in ln for ln in body)} gdc_wait() calls, "
                         f"{len(top)} at its body's top level; expected exactly one, at the top level")
            continue
        before = body[:top[0]]
        for ln in before:
            s = ln.strip()
            if s.startswith("return") or "tl.store(" in s or "tl.atomic_" in s:
                found.append(f"{kname}: before its wait: {s}")
            for callee in re.findall(r"\b(\w+)\(", s):
                if callee in fns and not callee.endswith("_pf") and callee not in ("_vm_prefetch",):
                    found.append(f"{kname}: calls {callee} before its wait")
                elif callee in fns and callee.endswith("_pf"):
                    cparams, cbody = fns[callee]
                    call = re.search(rf"\b{callee}\((.*)\)", s)
                    assert call is not None
                    cbound = dict(zip(cparams, _split_args(call.group(1)), strict=False))
                    for cl in cbody:
                        if "tl.load(" in cl or "tl.store(" in cl or "tl.atomic_" in cl:
                            found.append(f"{callee}: a prefetch function accesses memory: {cl.strip()}")
                    for w in _mentions(cbody):
                        if w in cbound and w.endswith("_ptr") and kind.get(cbound[w]) != "in":
                            found.append(f"{kname}: prefetches {bound.get(cbound[w])} ({w}) before its wait, "
                                         "which is not a program input")
        # (a call of a prefetch function passes it every parameter; what it touches is checked in its body above)
        plain = [ln for ln in before if not re.match(r"\s*\w+_pf\(", ln)]
        early = {w for w in _mentions(plain) if w in kind and kind[w] != "in"}
        for w in sorted(early):
            found.append(f"{kname}: mentions {w} ({bound[w]}, {kind[w]}) before its wait")
        if li == 0 and any("gdc_launch_dependents()" in ln for ln in before):
            found.append(f"{kname}: the program's first launch lets the next one start before its own wait")
        if li == 0 and any("tl.load(" in ln for ln in before):  # (a kernel before the program may write its inputs)
            found.append(f"{kname}: the program's first launch loads before its wait")
    return found
