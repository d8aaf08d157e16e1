"""Bilinear projections of finite-field outputs (Freivalds' trick), computed without forming the outputs.

The finite-field test compares, per trial and output ``O`` of shape ``(..., n)``, the residue
``sum(O * U * r) mod p`` with ``U`` uniform over every element of ``O.shape[:-1]`` and ``r`` uniform over
``n`` (both fresh per trial), instead of every element of ``O``. If the two programs' outputs differ in
the field, the difference ``D`` is a nonzero matrix (rows: all leading indices, columns: the last) and
``u^T D r`` is a nonzero polynomial of degree 2 in ``(u, r)``, so it vanishes with probability at most
``2 / p`` (Schwartz-Zippel); the test adds that to its per-trial bound.

Why: the projection is pushed backwards through every operation that is linear in one operand, the
way reverse-mode differentiation pushes an adjoint, so the last matmul of attention
(``softmax(Q K^T) V``), of a linear layer, of LoRA, ... becomes a matrix-vector product. A pushed
projection ("term") is a product of small arrays ("factors") broadcastable to the value's shape; a
value reached by terms is either pushed further (its :attr:`Part._lin` record says how it is built) or
computed and contracted with its terms ("a leaf"). Every push is an identity in the field (the rules
below), so the result is exactly ``sum(O * U * r) mod p`` however far it is pushed; where a rule does
not apply the value is simply computed. ``tests/test_verify_ff_proj.py`` checks the result against the
contraction of the fully computed outputs on every corpus program.

Rules (``W`` the term on a value, ``m`` the modulus):

* view of ``x`` (reshape, transpose, expand_dims, broadcast_to, basic indexing): ``W`` mapped back onto
  ``x``'s layout (summed over broadcast axes; zero outside an index);
* ``x + y``, ``x - y``: ``W`` to ``x``, ``+-W`` to ``y`` (each summed over its broadcast axes);
* ``x * y`` with ``y`` constant along the last or the second-to-last axis: ``W * y`` to ``x``
  (``y`` computed); ``x / y`` likewise with ``1 / y`` (the field's inverse, 0 for 0); ``c * x``: ``c W``;
* ``sum(x, axis)``: ``W`` (broadcast along the summed axis) to ``x``;
* ``a @ b`` with ``W = U * V`` (``U`` constant along the last axis, ``V`` along the rows):
  ``U * (b V)^T`` to ``a`` (``b`` computed), or ``(a^T U) * V`` to ``b`` (``a`` computed);
* ``concat``: the slice of ``W`` for each operand.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import numpy as np

from .arith import _inv, _modi, _sum_mod
from .products import _CHUNK
from .values import Part, as_kind, ints

Term = list[np.ndarray]

#: a co-factor of a product with at most this many elements is taken into the term whatever its shape
_SMALL = 1 << 12


# --------------------------------------------------------------------------- factors


def _prod(fs: Sequence[np.ndarray], m: int) -> np.ndarray | None:
    """The broadcast product of ``fs`` mod ``m`` (None for no factor)."""
    out: np.ndarray | None = None
    for f in fs:
        out = f if out is None else _modi(np.multiply(out, f), m)
    return out


def _scaled(term: Term, c: int | np.ndarray, m: int) -> Term:
    """``term`` times ``c`` (a residue or an array of the term's rank), applied to its smallest factor
    (or added as a factor when ``c`` is an array)."""
    if isinstance(c, np.ndarray):
        return [*term, c]
    k = min(range(len(term)), key=lambda i: term[i].size)
    out = list(term)
    out[k] = _modi(term[k] * np.int64(c % m), m)
    return out


def _compress(f: np.ndarray) -> np.ndarray:
    """``f`` with every axis along which it is constant cut to size 1 (exact comparisons)."""
    for ax in range(f.ndim):
        if f.shape[ax] > 1:
            first = np.take(f, [0], axis=ax)
            # (the second slice first: most axes differ there, and the full comparison reads all of f)
            if np.array_equal(first, np.take(f, [1], axis=ax)) and \
                    np.array_equal(np.broadcast_to(first, f.shape), f):
                f = first
    return f


def _same(a: np.ndarray, b: np.ndarray) -> bool:
    return a is b or (a.shape == b.shape and np.array_equal(a, b))


def _canon(term: Term, m: int) -> Term:
    """``term`` with its factors constant along the last axis multiplied into one (first), the others kept
    apart, so terms that differ only in a row scaling (e.g. the steps of a rescaled sum) merge. (Factors that
    vary along the last axis stay apart: one may be constant along the rows and another not, and only the
    first kind lets a matmul push the term on.)"""
    if len(term) <= 1 or not term[0].ndim:
        return term
    rows = _prod([f for f in term if f.shape[-1] == 1], m)
    return ([] if rows is None else [rows]) + [f for f in term if f.shape[-1] != 1]


def _merge(terms: list[Term], m: int) -> list[Term]:
    """Terms equal in all factors but one (same shapes there) summed into one, repeatedly; factors compressed."""
    terms = [[_compress(f) for f in _canon(t, m)] for t in terms]
    changed = True
    while changed and len(terms) > 1:
        changed = False
        for i in range(len(terms)):
            for j in range(i + 1, len(terms)):
                a, b = terms[i], terms[j]
                if len(a) != len(b):
                    continue
                diff = [k for k in range(len(a)) if not _same(a[k], b[k])]
                if len(diff) > 1 or (diff and a[diff[0]].shape != b[diff[0]].shape):
                    continue
                if not diff:  # the same term twice
                    merged = _scaled(a, 2, m)
                else:
                    k = diff[0]
                    merged = list(a)
                    merged[k] = _compress(_modi(a[k] + b[k], m))
                terms = [t for n, t in enumerate(terms) if n not in (i, j)] + [merged]
                changed = True
                break
            if changed:
                break
    return terms


def _sum_axis(term: Term, ax: int, n: int, m: int) -> Term:
    """``term`` summed over axis ``ax`` (of size ``n`` in the value), keeping it as size 1."""
    vary = [k for k, f in enumerate(term) if f.shape[ax] != 1]
    if not vary:
        return _scaled(term, n, m)
    if len(vary) > 1:
        joint = _prod([term[k] for k in vary], m)
        assert joint is not None
        term = [f for k, f in enumerate(term) if k not in vary] + [joint]
        vary = [len(term) - 1]
    k = vary[0]
    out = list(term)
    out[k] = _sum_mod(term[k], ax, m)
    return out


def _unbroadcast(term: Term, shape: tuple[int, ...], src: tuple[int, ...], m: int) -> Term:
    """A term on ``shape`` moved onto ``src``, which broadcasts to ``shape`` (summing where it was broadcast)."""
    lead = len(shape) - len(src)
    for ax in range(len(shape)):
        if ax < lead or (src[ax - lead] == 1 and shape[ax] != 1):
            term = _sum_axis(term, ax, shape[ax], m)
    if lead:
        term = [f.reshape(f.shape[lead:]) for f in term]
    return term


def _groups(a: Sequence[int], b: Sequence[int]) -> list[tuple[list[int], list[int]]] | None:
    """The smallest runs of axes of ``a`` and ``b`` (a row-major reshape between them) with equal products."""
    if 0 in a or 0 in b or math.prod(a) != math.prod(b):
        return None
    out: list[tuple[list[int], list[int]]] = []
    i = j = 0
    while i < len(a) or j < len(b):
        ga: list[int] = []
        gb: list[int] = []
        pa = pb = 1
        if i < len(a):
            ga.append(i)
            pa *= a[i]
            i += 1
        if j < len(b):
            gb.append(j)
            pb *= b[j]
            j += 1
        while pa != pb:
            if pa < pb:
                ga.append(i)
                pa *= a[i]
                i += 1
            else:
                gb.append(j)
                pb *= b[j]
                j += 1
        out.append((ga, gb))
    return out


def _unreshape(f: np.ndarray, shape: tuple[int, ...], src: tuple[int, ...]) -> np.ndarray | None:
    """A factor on ``shape`` (= ``src`` reshaped) moved onto ``src``, staying size 1 on runs it is constant on."""
    groups = _groups(src, shape)
    if groups is None:
        return None
    mid = list(f.shape)
    new = [1] * len(src)
    for ga, gb in groups:
        if any(f.shape[d] != 1 for d in gb):
            for d in gb:
                mid[d] = shape[d]
            for d in ga:
                new[d] = src[d]
    return np.broadcast_to(f, mid).reshape(new)


def _ungetitem(term: Term, shape: tuple[int, ...], src: tuple[int, ...], idx: Any) -> Term | None:
    """A term on ``x[idx]`` (basic indexing: ints, slices, one Ellipsis) moved onto ``x``: zero outside."""
    items = idx if isinstance(idx, tuple) else (idx,)
    if sum(it is Ellipsis for it in items) > 1:
        return None
    if Ellipsis in items:
        k = items.index(Ellipsis)
        rest = len(src) - (len(items) - 1)
        items = items[:k] + (slice(None),) * rest + items[k + 1 :]
    if len(items) > len(src):
        return None
    items = items + (slice(None),) * (len(src) - len(items))
    kinds: list[str] = []  # per src axis: "int", "part" (a strict slice) or "full"
    for d, it in enumerate(items):
        if isinstance(it, (int, np.integer)):
            kinds.append("int")
        elif isinstance(it, slice):
            kinds.append("full" if range(*it.indices(src[d])) == range(src[d]) else "part")
        else:
            return None
    # every factor in src layout (an int axis inserted with size 1)
    pos = tuple(d for d, k in enumerate(kinds) if k == "int")
    lifted = [np.expand_dims(f, pos) if pos else f for f in term]
    if all(k == "full" for k in kinds):
        return lifted
    # embed one factor (zeros outside idx; the others only need the right sizes): one constant along the last
    # axis if there is one (the loop steps of a rescaled sum then differ in that factor alone and merge), else
    # the smallest
    e = min(range(len(term)), key=lambda i: (term[i].ndim > 0 and term[i].shape[-1] != 1, term[i].size))
    out: Term = []
    for i, (f, g) in enumerate(zip(term, lifted, strict=True)):
        if i == e:
            emb_shape = [src[d] if kinds[d] != "full" else g.shape[d] for d in range(len(src))]
            emb = np.zeros(emb_shape, dtype=np.int64)
            emb[tuple(it if kinds[d] != "full" else slice(None) for d, it in enumerate(items))] = f
            out.append(emb)
        else:
            pad = [src[d] if kinds[d] == "part" and g.shape[d] != 1 else g.shape[d] for d in range(len(src))]
            if list(g.shape) != pad:
                full = np.zeros(pad, dtype=np.int64)
                full[tuple(items[d] if kinds[d] == "part" and g.shape[d] != 1 else slice(None)
                           for d in range(len(src)))] = g
                g = full
            out.append(g)
    return out


def _unview(term: Term, shape: tuple[int, ...], src: tuple[int, ...], spec: tuple[Any, ...], m: int) -> Term | None:
    kind = spec[0]
    if kind == "reshape":
        out = [_unreshape(f, shape, src) for f in term]
        return None if any(f is None for f in out) else out  # type: ignore[return-value]
    if kind == "transpose":
        inv = np.argsort(spec[1])
        return [f.transpose(inv) for f in term]
    if kind == "expand_dims":
        axis = spec[1] if isinstance(spec[1], tuple) else (spec[1],)
        axes = tuple(a % len(shape) for a in axis)
        return [np.squeeze(f, axis=axes) for f in term]
    if kind == "broadcast_to":
        return _unbroadcast(term, shape, src, m)
    if kind == "getitem":
        return _ungetitem(term, shape, src, spec[1])
    return None


# --------------------------------------------------------------------------- exact products


def _matvec_mod(a: np.ndarray, v: np.ndarray, m: int) -> np.ndarray:
    """Exact ``(a @ v[..., None])[..., 0] mod m`` of residues (batch dims broadcast): float64 BLAS in
    contraction chunks of at most 2048 (every partial sum an integer below 2**53)."""
    af = a if a.dtype == np.float64 else a.astype(np.float64)
    vf = v.astype(np.float64)[..., None]
    kk = a.shape[-1]
    out: np.ndarray | None = None
    for s in range(0, kk, _CHUNK):
        part = np.matmul(af[..., s : s + _CHUNK], vf[..., s : s + _CHUNK, :])[..., 0].astype(np.int64)
        out = part if out is None else _modi(np.add(out, part), m)
    assert out is not None
    return _modi(out, m)


def _value(part: Part, kind: str = "i") -> np.ndarray:
    return as_kind(part, "f").get() if kind == "f" else ints(part)


def _contract(part: Part, shape: tuple[int, ...], term: Term, m: int) -> int:
    """``sum(value(part) * prod(term)) mod m``, computing the part."""
    if not shape:
        x = ints(part)
        r = int(x) % m
        for f in term:
            r = r * int(f.reshape(())) % m
        return r
    along = [f for f in term if f.shape[-1] != 1]
    rest = [f for f in term if f.shape[-1] == 1]
    g = _prod(along, m)
    if g is None:
        s = _sum_mod(_value(part, part.kind), -1, m)
    elif len(shape) == 1 or g.shape[-2] == 1:
        row = g.reshape(g.shape[:-2] + g.shape[-1:]) if len(shape) > 1 else g
        s = _matvec_mod(_value(part, "f"), row, m)[..., None]
    else:
        s = _sum_mod(_modi(np.multiply(ints(part), g), m), -1, m)
    rp = _prod(rest, m)
    if rp is not None:
        s = _modi(np.multiply(s, rp), m)
    return int(s.sum(dtype=np.int64) % m)


# --------------------------------------------------------------------------- pushing


def _pushable(part: Part) -> bool:
    return part._lin is not None and not part.ready


def _worth(part: Part) -> bool:
    """Whether pushing into ``part`` can avoid computing something: it is built by a linear operation
    other than a view (following views), not a view chain of a computed part or an input."""
    while _pushable(part):
        lin = part._lin
        assert lin is not None
        if lin[0] != "view":
            return True
        part = lin[1]
    return False


def _constant_along(f_shape: tuple[int, ...], ax: int) -> bool:
    return len(f_shape) <= abs(ax) - 1 or f_shape[ax] == 1


def _push(part: Part, shape: tuple[int, ...], term: Term, m: int) -> list[tuple[Part, tuple[int, ...], Term]] | None:
    """The terms ``term`` on ``part`` becomes on the parts it is built from, or None (compute it)."""
    lin = part._lin
    assert lin is not None
    op = lin[0]
    if op == "view":
        _, src, src_shape, spec = lin
        t = _unview(term, shape, src_shape, spec, m)
        return None if t is None else [(src, src_shape, t)]
    if op == "scale":
        _, x, c = lin
        return [(x, shape, _scaled(term, int(c), m))]
    if op == "sum":
        _, x, xs, ax = lin
        return [(x, xs, term)]
    if op == "ring":
        _, kind, x, xs, y, ys = lin
        if kind in ("add", "sub"):
            ty = term if kind == "add" else _scaled(term, m - 1, m)
            return [(x, xs, _unbroadcast(term, shape, xs, m)), (y, ys, _unbroadcast(ty, shape, ys, m))]
        # x * y or x / y with the co-factor y constant along one of the last two axes: the term times y
        # (1 / y) goes to x, still a product of small factors, whether x is pushed further or contracted
        def small(s: tuple[int, ...]) -> bool:
            return len(s) < 2 or s[-1] == 1 or s[-2] == 1 or math.prod(s) <= _SMALL

        for a, a_s, b, b_s in ((x, xs, y, ys), (y, ys, x, xs)):
            if kind == "div" and a is y:
                break
            if small(b_s) and (a is not b or kind == "div"):
                bv = ints(b)
                if kind == "div":
                    bv = _inv(bv, m)
                lifted = bv.reshape((1,) * (len(shape) - bv.ndim) + bv.shape)
                return [(a, a_s, _unbroadcast([*term, lifted], shape, a_s, m))]
        return None
    if op == "matmul":
        _, a, a_s, b, b_s = lin
        return _push_matmul(shape, term, a, a_s, b, b_s, m)
    if op == "concat":
        _, parts, shapes, ax = lin
        out = []
        off = 0
        for p_, s_ in zip(parts, shapes, strict=True):
            n = s_[ax - (len(shape) - len(s_))] if ax >= len(shape) - len(s_) else 1
            sl = tuple(slice(off, off + n) if d == ax else slice(None) for d in range(len(shape)))
            sub_shape = tuple(n if d == ax else shape[d] for d in range(len(shape)))
            t = [f[sl] if f.shape[ax] != 1 else f for f in term]
            out.append((p_, s_, _unbroadcast(t, sub_shape, s_, m)))
            off += n
        return out
    return None


def _split_rows_cols(term: Term, shape: tuple[int, ...], m: int) -> tuple[Term, np.ndarray] | None:
    """A term on a matrix product split as ``U * V``: its factors constant along the last axis, and the
    product of the others as ``V`` (constant along the rows, of full width), or None if one varies along both."""
    us = [f for f in term if f.shape[-1] == 1]
    vs = [f for f in term if f.shape[-1] != 1]
    if any(f.shape[-2] != 1 for f in vs):
        return None
    v = _prod(vs, m)
    if v is None:
        v = np.ones((1,) * len(shape), dtype=np.int64)
    return us, np.broadcast_to(v, (*v.shape[:-1], shape[-1]))  # a matvec does not broadcast its contracted dim


def _push_matmul(shape: tuple[int, ...], term: Term, a: Part, a_s: tuple[int, ...], b: Part,
                 b_s: tuple[int, ...], m: int) -> list[tuple[Part, tuple[int, ...], Term]] | None:
    split = _split_rows_cols(term, shape, m)
    if split is None:
        return None  # a factor varying along both matrix axes: compute the product
    us, v = split
    nb = len(shape) - 2
    v_row = v.reshape(v.shape[:-2] + v.shape[-1:])  # (..., N)
    if _worth(a) or not _worth(b):
        if not _worth(a):
            return None  # neither operand is worth pushing into: contract the product as a leaf (below)
        t = _matvec_mod(_value(b, "f"), v_row, m)  # (..., K): b @ V
        t = t.reshape((*t.shape[:-1], 1, *t.shape[-1:]))
        full = (*tuple(np.broadcast_shapes(shape[:nb], t.shape[:-2])), shape[-2], a_s[-1])
        t = t.reshape((1,) * (len(full) - t.ndim) + t.shape)
        return [(a, a_s, _unbroadcast([*us, t], full, a_s, m))]
    # b is linear-built and a is not: (a^T U) * V onto b
    u = _prod(us, m)
    if u is None:
        u = np.ones((1,) * len(shape), dtype=np.int64)
    u_col = np.broadcast_to(u, (*u.shape[:-2], shape[-2], 1))
    u_col = u_col.reshape(u_col.shape[:-1])  # (..., M)
    av = _value(a, "f")
    s = _matvec_mod(np.swapaxes(av, -1, -2), u_col, m)  # (..., K)
    s = s[..., None]
    full = (*tuple(np.broadcast_shapes(shape[:nb], s.shape[:-2])), b_s[-2], shape[-1])
    s = s.reshape((1,) * (len(full) - s.ndim) + s.shape)
    vf = v.reshape((1,) * (len(full) - v.ndim) + v.shape)
    return [(b, b_s, _unbroadcast([s, vf], full, b_s, m))]


def _leaf_matmul(lin: tuple[Any, ...], shape: tuple[int, ...], term: Term, m: int) -> int | None:
    """``sum((a @ b) * term)`` as ``U . (a @ (b @ V))`` without forming ``a @ b``, or None."""
    _, a, _a_s, b, _b_s = lin
    split = _split_rows_cols(term, shape, m)
    if split is None:
        return None
    us, v = split
    t = _matvec_mod(_value(b, "f"), v.reshape(v.shape[:-2] + v.shape[-1:]), m)  # (..., K)
    y = _matvec_mod(_value(a, "f"), t, m)[..., None]  # (..., M, 1)
    u = _prod(us, m)
    if u is not None:
        y = _modi(np.multiply(y, u), m)
    return int(y.sum(dtype=np.int64) % m)


def project(root: Part, shape: tuple[int, ...], term: Term, m: int) -> int:
    """``sum(value(root) * prod(term)) mod m`` (``term``: arrays broadcastable to ``shape``, of its rank),
    pushing the projection through the linear operations that build ``root`` (see the module docstring)."""
    term = [np.asarray(f, dtype=np.int64).reshape((1,) * (len(shape) - np.ndim(f)) + np.shape(f)) for f in term]
    # users before operands: reverse post-order of the graph of linear-built, uncomputed parts. The order holds
    # ids, not parts: a part is processed only while a term is pending on it (``pending`` holds it, so its id is
    # its own), and a part the traversal met but no term reaches is not kept alive by it. (It was: contracting
    # the root, not pushable, computed every part below it while this list held them all: a K-loop's 128 tile
    # products of a full-size FFN region, ~14 GB.)
    order: list[int] = []
    state: dict[int, int] = {}
    stack: list[tuple[Part, bool]] = [(root, False)]
    while stack:
        node, done = stack.pop()
        if done:
            order.append(id(node))
            continue
        if id(node) in state:
            continue
        state[id(node)] = 1
        stack.append((node, True))
        if _pushable(node):
            for d in _operands(node):
                if id(d) not in state:
                    stack.append((d, False))
    pending: dict[int, tuple[Part, tuple[int, ...], list[Term]]] = {id(root): (root, shape, [term])}
    total = 0
    while order:
        entry = pending.pop(order.pop(), None)
        if entry is None:
            continue
        node, nshape, terms = entry
        del entry
        for t in _merge(terms, m):
            pushed = _push(node, nshape, t, m) if _pushable(node) else None
            if pushed is None:
                lin = node._lin
                r = _leaf_matmul(lin, nshape, t, m) if lin is not None and lin[0] == "matmul" and \
                    not node.ready else None
                total += _contract(node, nshape, t, m) if r is None else r
                continue
            for opnd, oshape, ot in pushed:
                e = pending.get(id(opnd))
                if e is None:
                    pending[id(opnd)] = (opnd, tuple(oshape), [ot])
                else:
                    e[2].append(ot)
    assert not pending, "ffproj: a term reached a part outside the traversal"
    return total % m


def _operands(part: Part) -> list[Part]:
    lin = part._lin
    assert lin is not None
    op = lin[0]
    if op == "view":
        return [lin[1]]
    if op in ("scale", "sum"):
        return [lin[1]]
    if op == "ring":
        return [lin[2], lin[4]]
    if op == "matmul":
        return [lin[1], lin[3]]
    if op == "concat":
        return list(lin[1])
    return []
