"""Canonical abstract expressions: index arithmetic and sum-of-products normal forms.

Every value is built by *smart constructors* that keep it in a canonical form,
so that two programs computing the same real function (up to the laws listed
in :data:`verimirage.smt.axioms.AXIOMS`) produce identical terms. Each
normalising step is one of those laws; the steps taken are logged (by law
name) in the active :class:`Derivation`, and each law is checked on concrete
random values in the tests.

Terms are plain nested tuples (hashable, comparable by ``repr``):

* index expressions (``Aff``): ``("A", const, ((iatom, coef), ...))`` with
  ``iatom`` one of ``("v", name)``, ``("fd", aff, n)`` (floor division),
  ``("md", aff, n)`` (modulo);
* polynomials (``Poly``): ``("P", ((mono, coef), ...))``, coef a Fraction,
  ``mono`` a sorted tuple of ``(atom, exponent)`` (exponent a Fraction; non-integer
  only for ``exp`` atoms, where ``exp(m)**c = exp(c*m)``);
* atoms: ``("in", name, (aff, ...))`` an input element; ``("exp", mono)``;
  ``("sum", var, lo, hi, mono)`` a sum over ``var`` in ``[lo, hi)`` of a
  monomial whose every factor depends on ``var``; ``("max", items)`` with items
  ``("pt", poly)`` or ``("rng", var, lo, hi, poly)``; ``("sqrt", poly)``;
  ``("inv", poly)`` (1/poly for a primitive poly of several terms);
  ``("fn", name, poly)`` (silu, gelu, relu, log of what has no exp factor: uninterpreted);
  ``("cat", aff, ((lo, hi, poly), ...))`` a piecewise value (concat).

Coefficients and exponents are :class:`Q`: Fractions whose hash is computed once per value (see there).

Bound variables are renamed ``r0, r1, ...`` by height (de Bruijn levels counted
from the innermost binder), so alpha-equivalent terms are identical.
"""

from __future__ import annotations

import contextvars
import itertools
import math
from collections.abc import Callable
from dataclasses import dataclass, field
from fractions import Fraction
from typing import Any

from . import limits

Aff = tuple
Poly = tuple
Mono = tuple
Atom = tuple


class AbstractionError(Exception):
    """The abstraction cannot express or normalise something (the verdict becomes Unknown)."""


class ResourceLimit(AbstractionError):
    """A term or constant grew past a cap of :mod:`verimirage.smt.limits` (the verdict becomes Unknown)."""


#: called in term construction and substitution; :mod:`verimirage.smt.budget` installs the search's time budget
checkpoint: Callable[[], None] = lambda: None  # noqa: E731

# --------------------------------------------------------------------------- derivation context


@dataclass
class Derivation:
    """Per-derivation state: variable ranges, the laws used, a node budget, definedness records."""

    ranges: dict[str, tuple[int, int]] = field(default_factory=dict)
    laws: set[str] = field(default_factory=set)
    budget: int = 2_000_000
    #: nodes (:func:`size`) its polynomials may still have in all: shared by the derivations of one check's cases
    room: list[int] = field(default_factory=lambda: [limits.MAX_DERIVED_NODES])
    counter: itertools.count = field(default_factory=itertools.count)
    #: definedness conditions recorded (:mod:`verimirage.smt.defined`), provenance of expressions, and
    #: how many ``where`` branches are being derived (conditions inside them are guarded)
    conds: list = field(default_factory=list)
    prov: dict = field(default_factory=dict)
    guard: int = 0

    def fresh(self, lo: int, hi: int, prefix: str = "_v") -> str:
        """A fresh variable ranging over ``[lo, hi)``."""
        name = f"{prefix}{next(self.counter)}"
        self.ranges[name] = (lo, hi)
        return name

    def use(self, law: str) -> None:
        """Record that normalisation used ``law``."""
        self.laws.add(law)
        self.charge(1)

    def charge(self, n: int) -> None:
        """Spend ``n`` of the node budget (:class:`ResourceLimit` when it runs out)."""
        self.budget -= n
        if self.budget < 0:
            raise ResourceLimit("normalisation budget exhausted")


_DER: contextvars.ContextVar[Derivation | None] = contextvars.ContextVar("verimirage_derivation", default=None)


def der() -> Derivation:
    """The active derivation."""
    d = _DER.get()
    if d is None:
        raise AbstractionError("no active derivation")
    return d


def activate(d: Derivation) -> contextvars.Token:
    """Make ``d`` the active derivation (returns a token for :func:`deactivate`)."""
    return _DER.set(d)


def deactivate(tok: contextvars.Token) -> None:
    """Undo :func:`activate`."""
    _DER.reset(tok)


#: ``repr`` of recently keyed values by identity (the value kept alive beside it, so an id is never reused
#: while its entry stands): the canonical sorts key the same monomials and atoms over and over, and ``repr``
#: of a nested term is linear in its size. Past :data:`_KEYS_MAX` entries or :data:`_KEYS_CHARS` characters
#: (a key is as long as its term's tree: a large derivation's keys must not outlive it) the older half is dropped.
_KEYS: dict[int, tuple[Any, str]] = {}
_KEYS_MAX, _KEYS_CHARS = 400_000, 1 << 26
_keys_chars = 0


def _key(x: Any) -> str:
    """``repr(x)``, built from the cached keys of ``x``'s parts: a new monomial or polynomial is mostly made of
    atoms keyed before (shared objects), so its key costs a join instead of printing every atom again. Index
    expressions (tag ``"A"``, small) and non-tuples are printed by ``repr`` itself. The string is exactly
    ``repr(x)`` (tuples print as ``(a, b)`` and ``(a,)``), so the canonical orders do not change."""
    e = _KEYS.get(id(x))
    if e is not None and e[0] is x:
        return e[1]
    if type(x) is tuple and x and x[0] != "A":
        parts = [_key(y) if type(y) is tuple else repr(y) for y in x]
        k = f"({parts[0]},)" if len(parts) == 1 else "(" + ", ".join(parts) + ")"
    else:
        k = repr(x)
    global _keys_chars
    if len(_KEYS) >= _KEYS_MAX or _keys_chars > _KEYS_CHARS:
        for i in list(itertools.islice(_KEYS, len(_KEYS) // 2)):
            _keys_chars -= len(_KEYS.pop(i, (None, ""))[1])
    _KEYS[id(x)] = (x, k)
    _keys_chars += len(k)
    return k


# --------------------------------------------------------------------------- rationals


class Q(Fraction):
    """The rationals of terms (coefficients, exponents): a Fraction whose hash is computed once.

    Terms are nested tuples, hashed again and again (memo tables, dict keys: a tuple does not keep its hash), and
    a Fraction's hash is a modular inverse computed in Python: it was about 40% of the abstract derivation of a
    decoder layer. A ``Q`` is equal to, hashes like and prints like the Fraction of the same value (canonical
    orders sort by ``repr``: they are unchanged); arithmetic on it gives plain Fractions, which :func:`as_q` turns
    back into the one ``Q`` of that value (interned, so equal coefficients are mostly the same object and a
    tuple comparison of equal terms skips ``Fraction.__eq__``).
    """

    __slots__ = ("_h",)
    _h: int

    def __hash__(self) -> int:  # type: ignore[override]
        return self._h

    def __repr__(self) -> str:
        return f"Fraction({self._numerator}, {self._denominator})"  # type: ignore[attr-defined]

    def __reduce__(self) -> tuple[Any, ...]:
        return (as_q, (Fraction(self._numerator, self._denominator),))  # type: ignore[attr-defined]


#: the interned ``Q`` of each (numerator, denominator) made so far (past :data:`_QS_MAX` entries it restarts with
#: :data:`ZERO`, :data:`ONE` and :data:`MINUS_ONE` alone; older values stay valid, only their sharing ends)
_QS: dict[tuple[int, int], Q] = {}
_QS_MAX = 1 << 16


def as_q(x: Fraction | int) -> Q:
    """The interned :class:`Q` of the rational ``x`` (an int, a Fraction or a Q)."""
    if type(x) is Q:
        return x
    if type(x) is int:
        key = (x, 1)
    else:
        f = x if isinstance(x, Fraction) else Fraction(x)
        key = (f.numerator, f.denominator)
    r = _QS.get(key)
    if r is None:
        if len(_QS) >= _QS_MAX:
            _reset_qs()
        r = Q(*key)
        r._h = Fraction.__hash__(r)
        _QS[key] = r
    return r


ZERO, ONE, MINUS_ONE = as_q(0), as_q(1), as_q(-1)


def _reset_qs() -> None:
    global _QS
    _QS = {(c.numerator, c.denominator): c for c in (ZERO, ONE, MINUS_ONE)}  # (one rebinding: no empty moment)


# --------------------------------------------------------------------------- index arithmetic


def aff(const: int = 0, terms: dict | None = None) -> Aff:
    """A canonical affine index expression."""
    items = tuple(sorted(((a, c) for a, c in (terms or {}).items() if c != 0), key=lambda t: _key(t[0])))
    return ("A", int(const), items)


def a_var(name: str) -> Aff:
    """The index variable ``name``."""
    return aff(0, {("v", name): 1})


def a_const(c: int) -> Aff:
    """The constant index ``c``."""
    return aff(int(c))


def a_is_const(a: Aff) -> bool:
    """Whether ``a`` is a constant."""
    return not a[2]


def a_add(x: Aff, y: Aff, k: int = 1) -> Aff:
    """``x + k*y`` (with ``(e//t)*t + e%t -> e`` recombination)."""
    terms: dict = dict(x[2])
    for a, c in y[2]:
        terms[a] = terms.get(a, 0) + k * c
    return _recombine(x[1] + k * y[1], terms)


def a_scale(x: Aff, k: int) -> Aff:
    """``k * x``."""
    return aff(x[1] * k, {a: c * k for a, c in x[2]})


def _nests(a: tuple) -> list[tuple[Aff, int, Aff]]:
    """Each ``(e, n, r)`` with atom ``a`` being ``(e // n + r) % m``."""
    if a[0] != "md":
        return []
    b = a[1]
    return [(at[1], at[2], aff(b[1], {x: k for x, k in b[2] if x != at})) for at, k in b[2] if at[0] == "fd" and k == 1]


def _recombine(const: int, terms: dict) -> Aff:
    changed = True
    while changed:
        changed = False
        for a, c in list(terms.items()):
            nest = next((t for t in _nests(a) if terms.get(("md", t[0], t[1]), 0) * t[1] == c), None) if c else None
            if nest is not None:
                # C*n*((e // n + r) % m) + C*(e % n) = C*((e + n*r) % (n*m)) for all integers (law index-mod-nest)
                e, n, r = nest
                terms[a] = terms[("md", e, n)] = 0
                whole = a_mod(a_add(e, r, n), n * a[2])
                for b, cb in whole[2]:
                    terms[b] = terms.get(b, 0) + c // n * cb
                const += c // n * whole[1]
                changed = True
                if _DER.get() is not None:
                    der().use("index-mod-nest")
                break
            if a[0] == "md" and c != 0:
                e, n = a[1], a[2]
                fd = ("fd", e, n)
                if terms.get(fd, 0) == c * n:
                    terms[a] = 0
                    terms[fd] = 0
                    for b, cb in e[2]:
                        terms[b] = terms.get(b, 0) + c * cb
                    const += c * e[1]
                    changed = True
                    if _DER.get() is not None:
                        der().use("index-divmod")
                    break
    return aff(const, terms)


def interval(x: Aff) -> tuple[int, int]:
    """Inclusive bounds ``(lo, hi)`` of ``x`` over the variables' ranges."""
    lo = hi = x[1]
    for a, c in x[2]:
        alo, ahi = _iatom_interval(a)
        if c >= 0:
            lo += c * alo
            hi += c * ahi
        else:
            lo += c * ahi
            hi += c * alo
    return lo, hi


def _iatom_interval(a: tuple) -> tuple[int, int]:
    if a[0] == "v":
        r = der().ranges.get(a[1])
        if r is None:
            raise AbstractionError(f"index variable {a[1]} has no range")
        return r[0], r[1] - 1
    lo, hi = interval(a[1])
    n = a[2]
    if a[0] == "fd":
        return lo // n, hi // n
    if lo // n == hi // n:
        return lo % n, hi % n
    return 0, n - 1


def _split(x: Aff, n: int) -> tuple[Aff, Aff]:
    """``x = n*A + B`` with A the terms whose coefficient n divides (and const // n)."""
    at: dict = {}
    bt: dict = {}
    for a, c in x[2]:
        if c % n == 0:
            at[a] = c // n
        else:
            bt[a] = c
    return aff(x[1] // n, at), aff(x[1] % n, bt)


def _nested(b: Aff, n: int) -> tuple[int, Aff, Aff] | None:
    """``(f, A, B)`` with ``b = f*A + B``, ``f`` a proper divisor of ``n`` (> 1, the largest such) and ``B``
    provably in ``[0, f)``: then ``b // n = A // (n/f)`` and ``b % n = f*(A % (n/f)) + B`` (law
    index-nested-div). A reshape's flat index ``16*i + j`` (j < 16) divided by 64 is ``i // 4``."""
    # f divides n and the coefficients of the terms it takes out: one of gcd(coefficient, n)
    for f in sorted({math.gcd(abs(c), n) for _, c in b[2]} - {1, n}, reverse=True):
        a2, b2 = _split(b, f)
        lo, hi = interval(b2)
        if lo >= 0 and hi < f and a2[2]:
            if _DER.get() is not None:
                der().use("index-nested-div")
            return f, a2, b2
    return None


def _mod_of(b: Aff, n: int) -> Aff | None:
    """``e`` when ``b`` is exactly ``e % k`` with ``n`` dividing ``k`` (law index-mod-div: then
    ``(e % k) // n = (e // n) % (k/n)`` and ``(e % k) % n = e % n``, for every integer ``e``), else None."""
    if b[1] != 0 or len(b[2]) != 1:
        return None
    (at, c), = b[2]
    if c != 1 or at[0] != "md" or at[2] % n != 0:
        return None
    if _DER.get() is not None:
        der().use("index-mod-div")
    return at[1]


def a_floordiv(x: Aff, n: int) -> Aff:
    """``x // n`` simplified when the remainder part provably lies in ``[0, n)``."""
    if n == 1:
        return x
    a, b = _split(x, n)
    lo, hi = interval(b)
    if lo >= 0 and hi < n:
        return a
    if lo // n == hi // n:
        return a_add(a, a_const(lo // n))
    nest = _nested(b, n)
    if nest is not None:
        f, a2, _ = nest
        return a_add(a, a_floordiv(a2, n // f))
    e = _mod_of(b, n)
    if e is not None:
        return a_add(a, a_mod(a_floordiv(e, n), b[2][0][0][2] // n))
    return a_add(a, aff(0, {("fd", b, n): 1}))


def a_mod(x: Aff, n: int) -> Aff:
    """``x % n`` simplified when the remainder part provably lies in ``[0, n)``."""
    if n == 1:
        return a_const(0)
    _, b = _split(x, n)
    lo, hi = interval(b)
    if lo // n == hi // n:
        return a_add(b, a_const(-(lo // n) * n))
    nest = _nested(b, n)
    if nest is not None:
        f, a2, b2 = nest
        return a_add(a_scale(a_mod(a2, n // f), f), b2)
    e = _mod_of(b, n)
    if e is not None:
        return a_mod(e, n)
    return aff(0, {("md", b, n): 1})


def a_vars(x: Aff) -> frozenset[str]:
    """Variables occurring in ``x``."""
    out: set[str] = set()
    for a, _ in x[2]:
        if a[0] == "v":
            out.add(a[1])
        else:
            out |= a_vars(a[1])
    return frozenset(out)


# --------------------------------------------------------------------------- free variables and substitution


#: results of :func:`free_vars` and :func:`height` by identity of the term (kept alive beside it, as in
#: :data:`_KEYS`): a value-keyed cache would hash the whole term on every call, and both recurse into every
#: subterm. Past :data:`_MEMO_MAX` entries the older half is dropped.
_FV: dict[int, tuple[Any, frozenset[str]]] = {}
_HEIGHT: dict[int, tuple[Any, int]] = {}
_SIZE: dict[int, tuple[Any, int]] = {}
_MEMO_MAX = 400_000
_NO_VARS: frozenset[str] = frozenset()


def _remember(memo: dict[int, tuple[Any, Any]], t: Any, v: Any) -> None:
    if len(memo) >= _MEMO_MAX:
        for i in list(itertools.islice(memo, _MEMO_MAX // 2)):
            memo.pop(i, None)
    memo[id(t)] = (t, v)


def free_vars(t: Any) -> frozenset[str]:
    """Free index variables of any term."""
    if not isinstance(t, tuple) or not t:
        return _NO_VARS
    e = _FV.get(id(t))
    if e is not None and e[0] is t:
        return e[1]
    tag = t[0]
    if tag == "A":
        out = a_vars(t)
    elif tag in ("sum", "rng"):
        out = (free_vars(t[4]) | free_vars(t[2]) | free_vars(t[3])) - {t[1]}
    else:
        out = _NO_VARS
        for x in t[1:] if isinstance(tag, str) else t:
            if isinstance(x, tuple):
                out = out | free_vars(x)
    _remember(_FV, t, out)
    return out


def subst(t: Any, var: str, rep: Aff) -> Any:
    """Substitute index variable ``var`` by ``rep`` everywhere in ``t`` (re-sorting canonical tuples)."""
    checkpoint()
    if not isinstance(t, tuple) or not t or var not in free_vars(t):
        return t
    tag = t[0]
    if tag == "A":
        out = aff(t[1], {})
        for a, c in t[2]:
            if a[0] == "v":
                term = rep if a[1] == var else a_var(a[1])
            else:
                term = aff(0, {(a[0], subst(a[1], var, rep), a[2]): 1})
            out = a_add(out, term, c)
        return out
    if tag == "P":
        return ("P", tuple(sorted(((subst(m, var, rep), c) for m, c in t[1]), key=lambda x: _key(x[0]))))
    if tag == "in":
        return ("in", t[1], tuple(subst(a, var, rep) for a in t[2]))
    if tag in ("sum", "rng"):
        return (tag, t[1], subst(t[2], var, rep), subst(t[3], var, rep), subst(t[4], var, rep))
    if tag == "cat":
        return ("cat", subst(t[1], var, rep), tuple((lo, hi, subst(p, var, rep)) for lo, hi, p in t[2]))
    if tag == "max":
        return ("max", tuple(sorted((subst(i, var, rep) for i in t[1]), key=_key)))
    if tag == "pt":
        return ("pt", subst(t[1], var, rep))
    if tag in ("exp", "sqrt", "inv"):
        return (tag, subst(t[1], var, rep))
    if tag == "fn":
        return ("fn", t[1], subst(t[2], var, rep))
    # a monomial: tuple of (atom, exp)
    return tuple(sorted(((subst(a, var, rep), e) for a, e in t), key=lambda x: _key(x[0])))


def size(t: Any) -> int:
    """The nodes of term ``t`` as a tree, a shared subterm counted at each use: what hashing, comparing and printing
    ``t`` walk (a term is a graph of shared tuples: its tree may be exponentially larger than the graph)."""
    if type(t) is not tuple:
        return 0
    e = _SIZE.get(id(t))
    if e is not None and e[0] is t:
        return e[1]  # type: ignore[no-any-return]
    n = 1 + sum(size(x) for x in t)
    _remember(_SIZE, t, n)
    return n


def height(t: Any) -> int:
    """1 + the largest canonical bound-variable level in ``t`` (0 if none)."""
    if not isinstance(t, tuple) or not t:
        return 0
    e = _HEIGHT.get(id(t))
    if e is not None and e[0] is t:
        return e[1]  # type: ignore[no-any-return]
    h = 0
    if t[0] in ("sum", "rng") and isinstance(t[1], str) and t[1].startswith("r"):
        h = int(t[1][1:]) + 1
    for x in t[1:] if isinstance(t[0], str) else t:
        if isinstance(x, tuple):
            h = max(h, height(x))
    _remember(_HEIGHT, t, h)
    return h


def _bind(var: str, body: Any, lo: Aff, hi: Aff) -> tuple[str, Any]:
    """Rename the bound ``var`` of ``body`` to its canonical level name."""
    name = f"r{height(body)}"
    return name, subst(body, var, a_var(name))


# --------------------------------------------------------------------------- polynomials


ONE_MONO: Mono = ()


def mono_mul(a: Mono, b: Mono) -> Mono:
    """Product of two monomials (exponents add)."""
    d: dict = dict(a)
    for at, e in b:
        d[at] = d.get(at, 0) + e
    out = []
    for at, e in d.items():
        e = as_q(e)
        if e.numerator:
            out.append((at, e))
    return tuple(sorted(out, key=lambda x: _key(x[0])))


def mono_pow(a: Mono, k: Fraction) -> Mono:
    """``a ** k``."""
    out = []
    for at, e in a:
        ek = as_q(e * k)
        if ek.numerator:
            out.append((at, ek))
    return tuple(out)


def poly(terms: dict[Mono, Fraction]) -> Poly:
    """The canonical polynomial with these terms (merging adjacent sum ranges)."""
    checkpoint()
    items = {}
    for m, c in terms.items():
        c = as_q(c)
        if c.numerator:
            items[m] = c
    for c in items.values():
        if c.denominator.bit_length() > limits.MAX_CONST_BITS or c.numerator.bit_length() > limits.MAX_CONST_BITS:
            raise ResourceLimit(f"a coefficient grew past {limits.MAX_CONST_BITS} bits")
    if sum(1 for m in items if _sum_factors(m)) >= 2:
        items = {m: as_q(c) for m, c in _merge_sums(items).items()}
    if (d := _DER.get()) is not None:  # (before the sort: it prints the monomials, as long as their trees)
        d.room[0] -= 2 + sum(1 + size(m) for m in items)
        if d.room[0] < 0:
            raise ResourceLimit(f"the derivation built terms of more than {limits.MAX_DERIVED_NODES} nodes")
    return ("P", tuple(sorted(items.items(), key=lambda x: _key(x[0]))))


def p_const(c: Fraction | int) -> Poly:
    """A constant."""
    return poly({ONE_MONO: as_q(c)})


def p_atom(a: Atom, e: Fraction | int = 1) -> Poly:
    """The polynomial ``a ** e``."""
    return poly({((a, as_q(e)),): ONE})


def p_mono(m: Mono, c: Fraction | int = 1) -> Poly:
    """The polynomial ``c * m``."""
    return poly({m: as_q(c)})


def p_add(x: Poly, y: Poly, k: Fraction | int = 1) -> Poly:
    """``x + k*y``."""
    d: dict = dict(x[1])
    for m, c in y[1]:
        d[m] = d.get(m, 0) + k * c
    return poly(d)


def p_scale(x: Poly, k: Fraction | int) -> Poly:
    """``k * x``."""
    return poly({m: c * k for m, c in x[1]})


def p_mul(x: Poly, y: Poly) -> Poly:
    """``x * y`` (fully expanded; past :data:`verimirage.smt.limits.MAX_PRODUCT_TERMS` term pairs a
    :class:`ResourceLimit`)."""
    n = len(x[1]) * len(y[1])
    if n > limits.MAX_PRODUCT_TERMS:
        raise ResourceLimit(f"a product of {len(x[1])} by {len(y[1])} terms (cap {limits.MAX_PRODUCT_TERMS} pairs)")
    if n > 64 and _DER.get() is not None:
        der().charge(n // 8)
    d: dict = {}
    for m1, c1 in x[1]:
        for m2, c2 in y[1]:
            m = mono_mul(m1, m2)
            d[m] = d.get(m, 0) + c1 * c2
    if len(x[1]) > 1 or len(y[1]) > 1:
        der().use("distribute")
    return poly(d)


def p_is_const(x: Poly) -> Fraction | None:
    """The constant value of ``x``, or None."""
    if not x[1]:
        return ZERO
    if len(x[1]) == 1 and x[1][0][0] == ONE_MONO:
        return x[1][0][1]
    return None


def p_single(x: Poly) -> tuple[Mono, Fraction] | None:
    """``(mono, coef)`` if ``x`` is a single term."""
    if len(x[1]) == 1:
        return x[1][0]
    return None


def _content(x: Poly) -> tuple[Fraction, Mono, Poly]:
    """``x = c * m * P`` with ``m`` the common monomial factor and ``P`` primitive (leading coef 1)."""
    monos = [m for m, _ in x[1]]
    common: dict = dict(monos[0])
    for m in monos[1:]:
        md = dict(m)
        for a in list(common):
            if a not in md:
                del common[a]
            else:
                common[a] = min(common[a], md[a]) if common[a] > 0 else max(common[a], md[a])
                if (common[a] > 0) != (md[a] > 0) or common[a] == 0:
                    del common[a]
    cm = tuple(sorted(((a, e) for a, e in common.items()), key=lambda t: _key(t[0])))
    inv_cm = mono_pow(cm, MINUS_ONE)
    lead = x[1][0][1]
    rest = poly({mono_mul(m, inv_cm): c / lead for m, c in x[1]})
    return lead, cm, rest


def p_inv(x: Poly) -> Poly:
    """``1 / x`` (x a monomial: negated exponents; else ``c**-1 m**-1 inv(P)``)."""
    if not x[1]:
        der().use("div-by-zero")
        raise AbstractionError("division by the zero polynomial")
    s = p_single(x)
    if s is not None:
        m, c = s
        der().use("div-monomial")
        return p_mono(mono_pow(m, MINUS_ONE), 1 / c)
    c, m, rest = _content(x)
    der().use("div-content")
    return p_mono(mono_mul(mono_pow(m, MINUS_ONE), ((("inv", rest), ONE),)), 1 / c)


def p_div(x: Poly, y: Poly) -> Poly:
    """``x / y``."""
    return p_mul(x, p_inv(y))


def p_exp(x: Poly) -> Poly:
    """``exp(x) = prod exp(m)**c`` over the terms ``c*m`` of ``x`` (exp of a constant c: ``exp(1)**c``)."""
    m_out: Mono = ONE_MONO
    for m, c in x[1]:
        m_out = mono_mul(m_out, ((("exp", m), c),))
    if len(x[1]) > 1:
        der().use("exp-add")
    return p_mono(m_out)


def p_log(x: Poly) -> Poly:
    """``log(x)`` with the factors of ``x`` taken out: ``log(exp(u) * y) = u + log(y)`` (law ``log-exp``;
    both sides are defined exactly where ``y > 0``, as ``exp(u) > 0``), so ``log(exp(u)) = u``; and
    ``log(a**e * y) = e log(a) + log(y)`` for the other atoms ``a`` (law ``log-mul``; ``log(inv(P)) =
    -log(P)``). The factors are those of a single term, or the common monomial factor of several
    (``x = c * m * P``); what is left is the atom ``("fn", "log", y)``, the uninterpreted log.

    ``log-mul`` holds for ``log |.|`` everywhere (``log|a b| = log|a| + log|b|``), and on positive values
    ``log |.|`` is log; it is no law of log where a factor is negative: there the split form is less
    defined, which the definedness check (:mod:`verimirage.smt.defined`) refuses unless the signs of the
    factors are known."""
    if len(x[1]) == 1:
        mono, c = x[1][0]
        rest = p_const(c)
    elif x[1]:
        c, mono, prim = _content(x)
        rest = p_scale(prim, c)
    else:
        return p_fn("log", x)
    if not mono:
        if p_is_const(x) == 1:  # log(1) = log(exp(0)) = 0
            der().use("log-exp")
            return poly({})
        return p_fn("log", x)
    others = [(a, e) for a, e in mono if a[0] != "exp"]
    if len(others) == 1 and others[0][1] == 1 and others[0][0][0] != "inv" and len(mono) == 1:
        return p_fn("log", x)  # log of one atom (times a constant): nothing to take out
    u = poly({})
    for a, e in mono:
        if a[0] == "exp":
            der().use("log-exp")
            u = p_add(u, p_mono(a[1], e))
        else:
            der().use("log-mul")
            u = p_add(u, p_scale(p_scale(p_log(a[1]), -1) if a[0] == "inv" else p_fn("log", p_atom(a)), e))
    return u if p_is_const(rest) == 1 else p_add(u, p_fn("log", rest))


def p_sqrt(x: Poly) -> Poly:
    """``sqrt(x)`` as an atom."""
    return p_atom(("sqrt", x))


def p_fn(name: str, x: Poly) -> Poly:
    """An uninterpreted unary function applied to ``x``."""
    return p_atom(("fn", name, x))


# --------------------------------------------------------------------------- sums


def _sum_factors(m: Mono) -> list[tuple[int, Atom]]:
    """The sum atoms (exponent 1) of monomial ``m`` and their positions."""
    return [(i, a) for i, (a, e) in enumerate(m) if a[0] == "sum" and e == 1]


def _merge_sums(items: dict) -> dict:
    """Merge terms ``c*m*sum_[a,b) f + c*m*sum_[b,c) f`` into ``c*m*sum_[a,c) f`` (``m`` may hold other sums:
    LayerNorm's mean times a K-tiled column sum is ``sum_k(X) * sum_[0,t)(G W) + sum_[t,2t)(G W) * sum_k(X)``
    in the canonical factor order; each sum factor of a monomial is tried)."""
    while True:
        groups: dict = {}
        for mono, c in items.items():
            for i, s in _sum_factors(mono):
                rest = mono[:i] + mono[i + 1 :]
                groups.setdefault((rest, c, s[1], s[4]), []).append((s[2], s[3], mono))
        used: set = set()
        changed = False
        for (rest, c, var, body), rs in groups.items():
            if len(rs) < 2 or any(mono in used for _, _, mono in rs):
                continue
            # sort by lower bound and merge adjacent runs: constant bounds, or affine ones (a split reduction's
            # steps inside an outer block, [s v + a, s v + b)) where every range has a constant length >= 0, so
            # that [a, b) and [b, c) (the same b) lie end to end whatever v is
            if not all((a_is_const(lo) and a_is_const(hi)) or _length_at_least_0(lo, hi) for lo, hi, _ in rs):
                continue
            rs.sort(key=lambda r: (_key(a_add(r[0], a_const(r[0][1]), -1)), r[0][1]))
            merged: list[list] = []
            for lo, hi, mono in rs:
                if merged and merged[-1][1] == lo:
                    merged[-1][1] = hi
                    merged[-1][2].append(mono)
                else:
                    merged.append([lo, hi, [mono]])
            for lo, hi, monos in merged:
                if len(monos) < 2:
                    continue
                der().use("sum-split-merge")
                for mono in monos:
                    used.add(mono)
                    items[mono] -= c
                    if items[mono] == 0:
                        del items[mono]
                new = mono_mul(rest, ((("sum", var, lo, hi, body), ONE),))
                items[new] = items.get(new, 0) + c
                changed = True
        if not changed:
            return items


def _length_at_least_0(lo: Aff, hi: Aff) -> bool:
    """Whether ``hi - lo`` is a constant >= 0."""
    d = a_add(hi, lo, -1)
    return a_is_const(d) and d[1] >= 0


def _offsets(t: Any, var: str, acc: set, bad: list) -> None:
    """Collect the affine offsets ``e - var`` of every index expression mentioning ``var``."""
    if not isinstance(t, tuple) or not t or var not in free_vars(t):
        return
    if t[0] == "A":
        coef = 0
        for a, c in t[2]:
            if a[0] == "v" and a[1] == var:
                coef = c
            elif a[0] != "v" and var in a_vars(a[1]):
                bad.append(t)
                return
        if coef != 1:
            bad.append(t)
            return
        acc.add(a_add(t, a_var(var), -1))
        return
    for x in t[1:] if isinstance(t[0], str) else t:
        _offsets(x, var, acc, bad)


def _block_merge(var: str, lo: int, hi: int, dep: Mono) -> Atom | None:
    """``sum_{var in [lo,hi)} sum_{r in [a + s*var, a + s*var + s)} f(r)`` (``f`` free of ``var``) as the
    one sum ``sum_{r in [a + s*lo, a + s*hi)} f(r)``: the blocks of a split reduction laid end to end
    (a split-K whose partial results are summed by a kernel-level ``sum``). None if ``dep`` is not such
    a single inner sum."""
    if len(dep) != 1 or dep[0][1] != 1 or dep[0][0][0] != "sum":
        return None
    _, name, ilo, ihi, body = dep[0][0]
    s = dict(ilo[2]).get(("v", var), 0)
    if s < 1 or a_add(ihi, ilo, -1) != a_const(s) or var in free_vars(body):
        return None
    rest = a_add(ilo, a_var(var), -s)
    if var in a_vars(rest):
        return None
    return ("sum", name, a_add(rest, a_const(s * lo)), a_add(rest, a_const(s * hi)), body)


def p_sum(var: str, x: Poly) -> Poly:
    """``sum over var in its range of x`` in canonical form.

    Terms are summed separately (sum-distribute); factors not depending on
    ``var`` move out (sum-factor-out); a term not depending on ``var`` is
    multiplied by the range's length (sum-const); the bound variable is shifted
    so that index expressions read ``var + 0`` (sum-shift) and renamed
    canonically.
    """
    d = der()
    lo, hi = d.ranges[var]
    out: dict = {}
    if len(x[1]) > 1:
        d.use("sum-distribute")
    for m, c in x[1]:
        indep = tuple((a, e) for a, e in m if var not in free_vars(a))
        dep = tuple((a, e) for a, e in m if var in free_vars(a))
        if not dep:
            d.use("sum-const")
            out[indep] = out.get(indep, 0) + c * (hi - lo)
            continue
        if indep:
            d.use("sum-factor-out")
        merged = _block_merge(var, lo, hi, dep)
        if merged is not None:
            d.use("sum-block-merge")
            mm = mono_mul(indep, ((merged, ONE),))
            out[mm] = out.get(mm, 0) + c
            continue
        body: Any = dep
        slo, shi = a_const(lo), a_const(hi)
        offs: set = set()
        bad: list = []
        _offsets(body, var, offs, bad)
        offs = {o for o in offs if a_vars(o) <= free_vars(body)}  # (not by an index a sum inside binds: captured)
        if not bad and offs:
            off = sorted(offs, key=_key)[0]
            if off != a_const(0) or lo != 0:
                d.use("sum-shift")
            rho = d.fresh(0, 1)
            body = subst(body, var, a_add(a_var(rho), off, -1))
            slo, shi = a_add(slo, off), a_add(shi, off)
            var_b = rho
        else:
            var_b = var
        name, body = _bind(var_b, body, slo, shi)
        atom = ("sum", name, slo, shi, body)
        mm = mono_mul(indep, ((atom, ONE),))
        out[mm] = out.get(mm, 0) + c
    return poly(out)


# --------------------------------------------------------------------------- max


def _max_items(x: Poly) -> tuple:
    s = p_single(x)
    if s is not None and s[1] == 1 and len(s[0]) == 1 and s[0][0][0][0] == "max" and s[0][0][1] == 1:
        return s[0][0][0][1]
    return (("pt", x),)


def _mk_max(items: list) -> Poly:
    uniq = {_key(i): i for i in items}
    its = sorted(uniq.values(), key=_key)
    # max is idempotent: union overlapping or adjacent ranges with equal bodies
    changed = True
    while changed:
        changed = False
        rngs = [i for i in its if i[0] == "rng" and a_is_const(i[2]) and a_is_const(i[3])]
        for a in rngs:
            for b in rngs:
                if a is not b and a[1] == b[1] and a[4] == b[4] and a[2][1] <= b[2][1] <= a[3][1]:
                    der().use("max-range-merge")
                    hi = a[3] if a[3][1] >= b[3][1] else b[3]
                    its = [i for i in its if i is not a and i is not b] + [("rng", a[1], a[2], hi, a[4])]
                    its = sorted({_key(i): i for i in its}.values(), key=_key)
                    changed = True
                    break
            if changed:
                break
    if len(its) == 1 and its[0][0] == "pt":
        return its[0][1]
    return p_atom(("max", tuple(its)))


def p_maximum(x: Poly, y: Poly) -> Poly:
    """``max(x, y)`` (flattened, idempotent, commutative)."""
    der().use("max-flatten")
    return _mk_max(list(_max_items(x)) + list(_max_items(y)))


def p_max_over(var: str, x: Poly) -> Poly:
    """``max over var in its range of x``."""
    d = der()
    lo, hi = d.ranges[var]
    if var not in free_vars(x):
        return x
    body: Any = x
    slo, shi = a_const(lo), a_const(hi)
    offs: set = set()
    bad: list = []
    _offsets(body, var, offs, bad)
    offs = {o for o in offs if a_vars(o) <= free_vars(body)}
    var_b = var
    if not bad and offs:
        off = sorted(offs, key=_key)[0]
        rho = d.fresh(0, 1)
        body = subst(body, var, a_add(a_var(rho), off, -1))
        slo, shi = a_add(slo, off), a_add(shi, off)
        var_b = rho
    name, body = _bind(var_b, body, slo, shi)
    # a max over a range of a max is flattened only when the body is not itself a max
    return _mk_max([("rng", name, slo, shi, body)])


# --------------------------------------------------------------------------- piecewise (concat)


def p_cat(idx: Aff, pieces: list[tuple[int, int, Callable[[Aff], Poly]]]) -> Poly:
    """Value of a concat at index ``idx``: the piece whose ``[lo, hi)`` holds it, if provable."""
    lo, hi = interval(idx)
    for plo, phi, fn in pieces:
        if plo <= lo and hi < phi:
            der().use("concat-select")
            return fn(a_add(idx, a_const(-plo)))
    # not resolvable here: record the split points; the caller splits the range
    raise NeedSplit(idx, tuple(p for p, _, _ in pieces[1:]))


class NeedSplit(Exception):
    """A piecewise value needs its index variable's range split at ``points`` (offsets of idx)."""

    def __init__(self, idx: Aff, points: tuple[int, ...]) -> None:
        super().__init__(f"split {idx} at {points}")
        self.idx = idx
        self.points = points
        d = _DER.get()  # (the ranges of its variables where it was raised: where to split, abstract._split)
        self.ranges = {v: d.ranges[v] for v in a_vars(idx) if v in d.ranges} if d is not None else {}


#: at most this many split points for an index ``x % n + k`` (one range per period of ``x`` and piece)
MOD_SPLITS_MAX = 256


def split_points(e: NeedSplit, var: str, span: tuple[int, int] | None = None) -> list[int] | None:
    """Values of ``var`` at which the split index crosses a piece boundary (``idx = var + b``); ``span``: the
    ``[lo, hi)`` range of ``var``, needed for an index ``x % n + k``. Only a hint: the piecewise value is selected
    on each part where its index's interval provably lies in one piece (:func:`p_cat`), else it splits again."""
    coef = dict(e.idx[2]).get(("v", var))
    terms = e.idx[2]
    if coef is None and len(terms) == 1 and terms[0][1] == 1 and terms[0][0][0] == "fd":
        # idx = x // n + k: it crosses p where x crosses (p - k) * n (a block index of a grid; law index-divmod)
        _, x, n = terms[0][0]
        return split_points(NeedSplit(x, tuple((p - e.idx[1]) * n for p in e.points)), var)
    if coef is None and len(terms) == 1 and terms[0][1] == 1 and terms[0][0][0] == "md" and span is not None:
        # idx = x % n + k (a concat read through a reshape that merges its axis with another, as heads merged
        # after a partial rotary): x starts a period at q*n and crosses p at q*n + (p - k), for each period q
        # of x over var's span
        _, x, n = terms[0][0]
        xc = dict(x[2]).get(("v", var))
        if xc not in (1, -1) or not a_is_const(a_add(x, a_var(var), -xc)):
            return None
        ends = (xc * span[0] + x[1], xc * (span[1] - 1) + x[1])
        offs = {0} | {p - e.idx[1] for p in e.points if 0 < p - e.idx[1] < n}
        pts = [q * n + r for q in range(min(ends) // n, max(ends) // n + 1) for r in offs]
        if len(pts) > MOD_SPLITS_MAX:
            return None
        return split_points(NeedSplit(x, tuple(pts)), var)
    if coef not in (1, -1):
        return None
    rest = a_add(e.idx, a_var(var), -coef)
    if not a_is_const(rest):
        return None
    b = rest[1]
    return sorted({(p - b) * coef + (0 if coef == 1 else 1) for p in e.points})


def key_of(t: Any) -> str:
    """A canonical string key of a term."""
    return _key(t)


def pretty(t: Any) -> str:
    """A readable rendering of a polynomial / atom / index expression."""
    if not isinstance(t, tuple) or not t:
        return str(t)
    tag = t[0]
    if tag == "A":
        parts = [str(t[1])] if t[1] or not t[2] else []
        for a, c in t[2]:
            s = a[1] if a[0] == "v" else f"({pretty(a[1])}{'//' if a[0] == 'fd' else '%'}{a[2]})"
            parts.append(s if c == 1 else f"{c}*{s}")
        return "+".join(parts)
    if tag == "P":
        if not t[1]:
            return "0"
        out = []
        for m, c in t[1]:
            ms = "*".join(pretty(a) + ("" if e == 1 else f"^{e}") for a, e in m)
            out.append(ms if c == 1 and ms else (str(c) if not ms else f"{c}*{ms}"))
        return " + ".join(out)
    if tag == "in":
        return f"{t[1]}[{','.join(pretty(a) for a in t[2])}]"
    if tag == "exp":
        return "exp(" + ("*".join(pretty(a) + ("" if e == 1 else f"^{e}") for a, e in t[1]) or "1") + ")"
    if tag in ("sum", "rng"):
        body = pretty(t[4]) if t[0] == "rng" else "*".join(pretty(a) + ("" if e == 1 else f"^{e}") for a, e in t[4])
        return f"{'Σ' if tag == 'sum' else 'max'}[{t[1]}∈{pretty(t[2])}..{pretty(t[3])}]({body})"
    if tag == "max":
        return "max(" + ", ".join(pretty(i[1]) if i[0] == "pt" else pretty(i) for i in t[1]) + ")"
    if tag in ("sqrt", "inv"):
        return f"{tag}({pretty(t[1])})"
    if tag == "fn":
        return f"{t[1]}({pretty(t[2])})"
    return repr(t)


# --------------------------------------------------------------------------- nested sums (Fubini)

_FLAT = itertools.count()

#: chains of more nested sums than this keep their order (canonical order tries every permutation)
MAX_INTERCHANGE = 5


def canon_sums(p: Poly) -> tuple[Poly, set[str]]:
    """``p`` with every chain of nested sums over independent (constant) ranges in one canonical form,
    and the laws used.

    A sum whose body holds sums over constant ranges (exponent 1) is flattened: every factor moves into
    the innermost body (``a * sum_j f_j = sum_j a * f_j``, sum-factor-out read backwards) and the
    bound variables are ordered canonically (``sum_i sum_j f = sum_j sum_i f``, sum-interchange): of
    every nesting order, the one whose term sorts first. Two expressions equal up to these laws get
    the same term. :func:`verimirage.smt.verify.abstract_check` uses it when the construction normal
    forms differ.
    """
    d = Derivation()
    tok = activate(d)
    try:
        return _canon_poly(_fold_runs(p)), d.laws
    finally:
        deactivate(tok)


#: the placeholder a constant index is replaced by when terms are compared for :func:`_fold_runs`
_FOLD_VAR = ("A", 0, ((("v", "_fold"), 1),))


def _in_consts(t: Any, acc: set[int]) -> None:
    """Constant indices of the input elements read in ``t``."""
    if not isinstance(t, tuple) or not t or t[0] == "A":
        return
    if t[0] == "in":
        acc.update(a[1] for a in t[2] if a_is_const(a))
        return
    for x in t[1:] if isinstance(t[0], str) else t:
        _in_consts(x, acc)


def _sub_const(t: Any, c: int, rep: Aff) -> Any:
    """``t`` with every input element index equal to the constant ``c`` replaced by ``rep`` (other index
    expressions, such as sum bounds, kept; canonical tuples re-sorted)."""
    checkpoint()
    if not isinstance(t, tuple) or not t:
        return t
    tag = t[0]
    if tag == "A":
        return t
    if tag == "P":
        return ("P", tuple(sorted(((_sub_const(m, c, rep), k) for m, k in t[1]), key=lambda x: _key(x[0]))))
    if tag == "in":
        return ("in", t[1], tuple(rep if a_is_const(a) and a[1] == c else a for a in t[2]))
    if tag in ("sum", "rng"):
        return (tag, t[1], t[2], t[3], _sub_const(t[4], c, rep))
    if tag == "cat":
        return ("cat", t[1], tuple((lo, hi, _sub_const(q, c, rep)) for lo, hi, q in t[2]))
    if tag == "max":
        return ("max", tuple(sorted((_sub_const(i, c, rep) for i in t[1]), key=_key)))
    if tag == "pt":
        return ("pt", _sub_const(t[1], c, rep))
    if tag in ("exp", "sqrt", "inv"):
        return (tag, _sub_const(t[1], c, rep))
    if tag == "fn":
        return ("fn", t[1], _sub_const(t[2], c, rep))
    return tuple(sorted(((_sub_const(a, c, rep), e) for a, e in t), key=lambda x: _key(x[0])))


def _fold_runs(p: Poly) -> Poly:
    """Terms ``k * f(a) + k * f(a+1) + ... + k * f(b-1)`` (equal but for one constant index, every one of its
    occurrences in input elements) as ``k * sum_[a,b) f`` (law sum-fold). A split reduction whose every split
    is one row (cross-entropy's mean over 16 rows in 16 blocks) derives as such a run of terms; the source,
    as a sum over the rows."""
    d = der()
    items = dict(p[1])
    changed = True
    while changed:
        changed = False
        groups: dict = {}
        for m, coef in items.items():
            cs: set[int] = set()
            _in_consts(m, cs)
            for c in cs:
                groups.setdefault((_sub_const(m, c, _FOLD_VAR), coef), {}).setdefault(c, m)
        used: set = set()
        for (_, coef), by_c in groups.items():
            ks = sorted(by_c)
            runs: list[list[int]] = []
            for c in ks:
                if runs and runs[-1][-1] == c - 1:
                    runs[-1].append(c)
                else:
                    runs.append([c])
            for run in runs:
                monos = [by_c[c] for c in run]
                if len(run) < 2 or any(m in used or items.get(m) != coef for m in monos):
                    continue
                v = d.fresh(run[0], run[-1] + 1)
                folded = p_sum(v, p_mono(_sub_const(monos[0], run[0], a_var(v))))
                d.use("sum-fold")
                for m in monos:
                    used.add(m)
                    del items[m]
                for m2, c2 in folded[1]:
                    items[m2] = items.get(m2, 0) + coef * c2
                    used.add(m2)
                changed = True
        items = {m: c for m, c in items.items() if c != 0}
    return poly(items)


def _canon_poly(p: Poly) -> Poly:
    out: dict = {}
    for m, c in p[1]:
        mm, k = _canon_mono(m)
        out[mm] = out.get(mm, 0) + c * k
    return poly(out)


def _canon_mono(m: Mono) -> tuple[Mono, Fraction]:
    out: Mono = ONE_MONO
    coef = Fraction(1)
    for a, e in m:
        a2, extra, k = _canon_atom(a)
        if extra is None:
            out = mono_mul(out, ((a2, e),))
            continue
        # a re-normalised inv atom: inv(P) = k * extra * inv(P') (P' primitive)
        if e.denominator != 1:
            raise AbstractionError("a fractional power of an inverse")
        out = mono_mul(out, mono_mul(mono_pow(extra, e), ((a2, e),)))
        coef *= k ** int(e)
    return out, coef


def _canon_atom(a: Atom) -> tuple[Atom, Mono | None, Fraction]:
    tag = a[0]
    if tag == "in":
        return a, None, Fraction(1)
    if tag == "exp":
        m, k = _canon_mono(a[1])
        if k != 1:  # exp(k * m) as exp(m)**k is the construction form; keep it exact and simple
            raise AbstractionError("a coefficient inside an exp atom")
        return ("exp", m), None, Fraction(1)
    if tag == "sqrt":
        return ("sqrt", _canon_poly(a[1])), None, Fraction(1)
    if tag == "inv":
        q = _canon_poly(a[1])
        if q == a[1]:
            return a, None, Fraction(1)
        if not q[1]:
            raise AbstractionError("division by the zero polynomial")
        c, cm, rest = _content(q)
        return ("inv", rest), mono_pow(cm, MINUS_ONE), 1 / c
    if tag == "fn":
        return ("fn", a[1], _canon_poly(a[2])), None, Fraction(1)
    if tag == "max":
        items: list[tuple] = []
        for it in a[1]:
            if it[0] == "pt":
                items.append(("pt", _canon_poly(it[1])))
            else:
                fresh = _fresh_name()
                q = _canon_poly(subst(it[4], it[1], a_var(fresh)))
                name, q = _bind(fresh, q, it[2], it[3])
                items.append(("rng", name, it[2], it[3], q))
        return ("max", tuple(sorted(items, key=_key))), None, Fraction(1)
    if tag == "cat":
        return ("cat", a[1], tuple((lo, hi, _canon_poly(q)) for lo, hi, q in a[2])), None, Fraction(1)
    if tag == "sum":
        # the binder gets a fresh name first: canonicalising the body may raise the levels inside it
        fresh = _fresh_name()
        body, k = _canon_mono(subst(a[4], a[1], a_var(fresh)))
        if k != 1:
            raise AbstractionError("a coefficient inside a sum atom")
        if a_is_const(a[2]) and a_is_const(a[3]) and any(_flat_sum(b, e) for b, e in body):
            return _flatten_sum(fresh, a[2], a[3], body), None, Fraction(1)
        name, body = _bind(fresh, body, a[2], a[3])
        return ("sum", name, a[2], a[3], body), None, Fraction(1)
    raise AbstractionError(f"unknown atom {tag!r}")


def _flat_sum(a: Atom, e: Fraction) -> bool:
    return a[0] == "sum" and e == 1 and a_is_const(a[2]) and a_is_const(a[3])


def _fresh_name() -> str:
    return f"_fz{next(_FLAT)}"


def _flatten_sum(var: str, lo: Aff, hi: Aff, body: Mono) -> Atom:
    """``sum_var body`` (constant range; ``var`` a unique name; ``body`` canonical with sums over
    constant ranges among its factors) as one canonical chain of sums with every factor innermost."""
    chain: list[tuple[str, Aff, Aff]] = [(var, lo, hi)]

    def unwrap(b_body: Mono) -> Mono:
        out: Mono = ONE_MONO
        for b, e in b_body:
            if _flat_sum(b, e):
                # b's binder level is above every level inside its body: renaming it captures nothing
                nv = _fresh_name()
                chain.append((nv, b[2], b[3]))
                out = mono_mul(out, unwrap(subst(b[4], b[1], a_var(nv))))
            else:
                out = mono_mul(out, ((b, e),))
        return out

    flat = unwrap(body)
    d = der()
    d.use("sum-factor-out")
    d.use("sum-interchange")
    orders = itertools.permutations(chain) if len(chain) <= MAX_INTERCHANGE else iter([tuple(chain)])
    best: Atom | None = None
    for order in orders:
        cur = flat
        at: Atom = ()
        for v, vlo, vhi in reversed(order):
            name, b = _bind(v, cur, vlo, vhi)
            at = ("sum", name, vlo, vhi, b)
            cur = ((at, ONE),)
        if best is None or _key(at) < _key(best):
            best = at
    assert best is not None
    return best
