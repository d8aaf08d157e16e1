"""Helpers on residue arrays: marks, inverses, fast mod, the keyed mix of the oracles, ring ops.

Part of the fast finite-field engine (cross-checked against :mod:`verimirage.smt.ffref`).
"""

from __future__ import annotations

from functools import lru_cache

import numpy as np

# --------------------------------------------------------------------------- helpers on arrays


def _mark(out_q: np.ndarray, *qs: np.ndarray) -> np.ndarray:
    """Set ``out_q`` to -1 wherever any operand's q-part is meaningless (-1); returns ``out_q``."""
    bad = qs[0] < 0
    for x in qs[1:]:
        bad = bad | (x < 0)
    if bad.any():
        out_q[np.broadcast_to(bad, out_q.shape)] = -1
    return out_q


#: arrays of at least this many elements are inverted through :func:`_inv_table` (built once per modulus, ~60 ms,
#: then one gather an element: ~7 ns, against ~100 ns for the 40 multiplications mod m of ``x**(m-2)``)
INV_TABLE_MIN = 1 << 15


def _primitive_root(m: int) -> int:
    """The least generator of the multiplicative group mod the prime ``m`` (factors of ``m - 1`` by trial division)."""
    n, fs, d = m - 1, [], 2
    while d * d <= n:
        if n % d == 0:
            fs.append(d)
            while n % d == 0:
                n //= d
        d += 1
    if n > 1:
        fs.append(n)
    for r in range(2, m):
        if all(pow(r, (m - 1) // f, m) != 1 for f in fs):
            return r
    raise ValueError(f"no primitive root mod {m}")  # pragma: no cover (m is not prime)


@lru_cache(maxsize=12)
def _inv_table(m: int) -> np.ndarray:
    """``x**-1 mod m`` for every residue ``x`` of the prime ``m`` (``0 -> 0``), int32, read-only (cached).

    With ``r`` a primitive root, ``r**k`` runs over every nonzero residue once for k in [0, m - 1) and its inverse
    is ``r**(m - 1 - k)``. The table is checked entry by entry (``x * t[x] = 1 mod m`` for every nonzero ``x``)
    before it is used, so a wrong table (``m`` not prime) raises instead of giving wrong inverses."""
    r = _primitive_root(m)
    b = 1024
    small = np.array([pow(r, i, m) for i in range(b)], dtype=np.int64)
    nb = (m - 1) // b + 1
    rb = pow(r, b, m)
    big = np.array([pow(rb, i, m) for i in range(nb)], dtype=np.int64)
    pw = (big[:, None] * small[None, :] % m).reshape(-1)[: m - 1]  # r**k, k in [0, m - 1)
    t = np.zeros(m, dtype=np.int32)
    t[pw] = np.concatenate((pw[:1], pw[:0:-1]))  # t[r**k] = r**(m-1-k) (k = 0: 1)
    x = np.arange(1, m, dtype=np.int64)
    if not (x * t[1:] % m == 1).all():
        raise RuntimeError(f"ff: the inverse table mod {m} is wrong (is {m} prime?)")
    t.flags.writeable = False
    return t


def _inv(x: np.ndarray, m: int) -> np.ndarray:
    """Modular inverse elementwise (x**(m-2)); the inverse of 0 is 0 (documented). Large arrays look the
    inverse up in :func:`_inv_table` (the same values: the inverse of a nonzero residue is unique)."""
    if x.size >= INV_TABLE_MIN and m < 1 << 31:
        return _inv_table(m).take(np.asarray(x, dtype=np.int64), mode="wrap").astype(np.int64)
    r = np.ones_like(x)
    b = x % m
    e = m - 2
    while e:
        if e & 1:
            r = r * b % m
        b = b * b % m
        e >>= 1
    return r


_MOD_CHUNK = 1 << 16


def _modi(x: np.ndarray, m: int) -> np.ndarray:
    """``x %= m`` in place for an int64 array ``x`` (any sign); returns ``x``.

    Computed as ``x - (x // m) * m`` over cache-sized chunks: numpy's integer ``//`` by a scalar is
    several times faster than its ``%`` (which is slowest on negative values)."""
    if x.size < _MOD_CHUNK or not x.flags.writeable:
        x %= m
        return x
    flat = x.ravel(order="K")
    if not np.shares_memory(flat, x):
        x %= m
        return x
    k = np.empty(min(_MOD_CHUNK, flat.size), dtype=np.int64)
    for s in range(0, flat.size, _MOD_CHUNK):
        xs = flat[s : s + _MOD_CHUNK]
        ks = k[: xs.size]
        np.floor_divide(xs, m, out=ks)
        ks *= m
        xs -= ks
    return x


def _f2i_mod(c: np.ndarray, m: int) -> np.ndarray:
    """The int64 residues mod ``m`` of a C-contiguous float64 array ``c`` of integers below 2**53 in
    absolute value, written over ``c``'s own memory (``c`` is consumed), in cache-sized chunks."""
    if c.size < _MOD_CHUNK or not (c.flags.c_contiguous and c.flags.writeable):
        return _modi(c.astype(np.int64), m)
    src = c.reshape(-1)
    dst = src.view(np.int64)
    t = np.empty(min(_MOD_CHUNK, src.size), dtype=np.int64)
    k = np.empty_like(t)
    for s in range(0, src.size, _MOD_CHUNK):
        n = min(_MOD_CHUNK, src.size - s)
        ts, ks = t[:n], k[:n]
        np.copyto(ts, src[s : s + n], casting="unsafe")  # exact: integers below 2**53
        np.floor_divide(ts, m, out=ks)
        ks *= m
        np.subtract(ts, ks, out=dst[s : s + n])
    return dst.reshape(c.shape)


def _mix(x: np.ndarray, key: int, salt: int) -> np.ndarray:
    """A keyed 64-bit mixing function (splitmix64 finaliser) of non-negative ints."""
    z = x.astype(np.uint64) + np.uint64((key ^ (salt * 0x9E3779B97F4A7C15)) & 0xFFFFFFFFFFFFFFFF)
    with np.errstate(over="ignore"):
        z = (z ^ (z >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
        z = (z ^ (z >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
        z = z ^ (z >> np.uint64(31))
    return z


_UFUNC = {"add": np.add, "sub": np.subtract, "mul": np.multiply}


def _ring_arr(kind: str, x: np.ndarray, y: np.ndarray, m: int) -> np.ndarray:
    """``x op y mod m`` of residue arrays (broadcasting)."""
    if kind == "div":
        r = np.multiply(x, _inv(y, m))
    else:
        r = _UFUNC[kind](x, y)
    return _modi(r, m)


def _ring_q(kind: str, x: np.ndarray, y: np.ndarray, q: int, marks: bool) -> np.ndarray:
    """The q-part of ``x op y``; ``marks``: an operand may hold -1 (the result is -1 there)."""
    if not marks:
        return _ring_arr(kind, x, y, q)
    r = _ring_arr(kind, x, np.maximum(y, 0) if kind == "div" else y, q)
    return _mark(r, x, y)


def _sum_mod(v: np.ndarray, ax: int, m: int) -> np.ndarray:
    """``v.sum(axis=ax) mod m`` (keepdims) of int64 or float64 residues (exact: a float64 sum of
    fewer than 2**32 residues below 2**21 is an integer below 2**53)."""
    if v.dtype == np.float64 and v.shape[ax] < 1 << 32:
        r = v.sum(axis=ax, keepdims=True).astype(np.int64)
    else:
        r = v.astype(np.int64, copy=False).sum(axis=ax, keepdims=True)
    return _modi(r, m)
