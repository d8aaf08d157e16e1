"""The exact modular product engine: float64 BLAS in contraction chunks, folded batch axes, row blocks
with epilogues (fused exp), shared products (:mod:`.share`) and GPU products (:mod:`.gpu`).

An accelerator: the reference evaluator (:mod:`verimirage.smt.ffref`) computes the same products plainly.
"""

from __future__ import annotations

import contextlib
import ctypes
import glob
import math
import os
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import numpy as np

from ...ir.errors import GraphError
from . import gpu as ffgpu
from . import share as ffshare
from .arith import _f2i_mod, _modi
from .field import _exp_table_f32, _gather_into

#: contraction chunk: (P_MAX - 1)**2 * 2048 < 2**53, so float64 partial sums of residue products are exact
_CHUNK = 1 << 11


# --------------------------------------------------------------------------- matmul


def _find_openblas() -> Any:
    try:
        libs = glob.glob(os.path.join(os.path.dirname(np.__file__), os.pardir, "numpy.libs", "*openblas*"))
        for path in libs:
            lib = ctypes.CDLL(path)
            for suffix in ("scipy_openblas_{}_num_threads64_", "openblas_{}_num_threads"):
                get = getattr(lib, suffix.format("get"), None)
                set_ = getattr(lib, suffix.format("set"), None)
                if get is not None and set_ is not None:
                    get.restype = ctypes.c_int
                    set_.argtypes = [ctypes.c_int]
                    return get, set_
    except OSError:
        pass
    return None


_BLAS: Any = None
_BLAS_SEARCHED = False


@contextlib.contextmanager
def _one_blas_thread() -> Iterator[None]:
    """Run numpy's OpenBLAS on one thread inside (on a small shared machine a threaded OpenBLAS spends
    more time waking and waiting for its threads than it saves on the many mid-size products here)."""
    global _BLAS, _BLAS_SEARCHED
    if not _BLAS_SEARCHED:
        _BLAS_SEARCHED = True
        _BLAS = _find_openblas()
    if _BLAS is None:
        yield
        return
    get, set_ = _BLAS
    n = get()
    if n == 1:
        yield
        return
    set_(1)
    try:
        yield
    finally:
        set_(n)


def _as_float(a: np.ndarray, perm: Sequence[int], shape: tuple[int, ...]) -> np.ndarray:
    """``a.transpose(perm)`` as a C-contiguous float64 array of ``shape`` (a view when it can be)."""
    t = a.transpose(perm)
    if t.dtype == np.float64:
        return np.ascontiguousarray(t).reshape(shape)
    out = np.empty(t.shape, dtype=np.float64)
    np.copyto(out, t, casting="unsafe")
    return out.reshape(shape)


#: a product with at least this many elements is computed in row blocks of about this many (its float64 block
#: stays in cache while it is reduced, instead of a second pass over a product-sized array)
_BLOCK_ELEMS = 1 << 17


def _blocked_matmul(af: np.ndarray, bf: np.ndarray, out: np.ndarray,
                    epi: Callable[[np.ndarray, np.ndarray], None]) -> None:
    """``epi(af[i, rows] @ bf[i], out[i, rows])`` over row blocks of about :data:`_BLOCK_ELEMS` elements."""
    n_both, rows, _ = af.shape
    cols = bf.shape[-1]
    step = max(1, min(rows, _BLOCK_ELEMS // max(cols, 1)))
    buf = np.empty((step, cols), dtype=np.float64)
    for i in range(n_both):
        for r0 in range(0, rows, step):
            r1 = min(rows, r0 + step)
            tb = buf[: r1 - r0]
            np.matmul(af[i, r0:r1], bf[i], out=tb)
            epi(tb, out[i, r0:r1])


def exp_epilogue(p: int, q: int, g: int) -> Callable[[np.ndarray, np.ndarray], None]:
    """The block epilogue of an exp-fused product (for :func:`_blocked_matmul`): ``dst = g ** (tb mod q) mod p``
    for a float64 block ``tb`` of the product and a C-contiguous float64 ``dst``."""
    table = _exp_table_f32(p, q, g)

    def epi(tb: np.ndarray, dst: np.ndarray) -> None:
        idx = np.empty(tb.shape, dtype=np.int64)
        _f2i_into(tb, q, idx)
        assert dst.flags.c_contiguous  # (a row block of the fresh product array: reshape is a view)
        # through a float32 table and a small buffer: a float64 table gathered straight into the result
        # ran 2.86 s instead of 1.83 s on the gqa b8 pair (one thread), though faster in isolation
        _gather_into(table, idx.reshape(-1), dst.reshape(-1))

    return epi


def _f2i_into(tb: np.ndarray, m: int, dst: np.ndarray) -> None:
    """``dst[...] = tb mod m`` for a float64 block of integers below 2**53 and an int64 ``dst``."""
    np.copyto(dst, tb, casting="unsafe")
    _modi(dst, m)


def _matmul_mod(a: np.ndarray, b: np.ndarray, m: int,
                epi: tuple[Callable[[np.ndarray, np.ndarray], None], Any, tuple[Any, ...]] | None = None
                ) -> np.ndarray:
    """Exact ``a @ b mod m`` of residue arrays in [0, m), m <= 2**21, with broadcast batch dims.

    Batch axes along which only ``a`` varies are folded into its rows, those along which only ``b``
    varies into its columns; each remaining batch item is one float64 BLAS product per contraction
    chunk of at most 2048 (exact: every partial sum is an integer below 2**53). The result is an
    int64 array of the broadcast shape (possibly a transposed view). ``epi``: ``(fn, dtype, tag)``: instead,
    ``fn(block, dst)`` writes the result of each float64 block of the product (integers below 2**53, not
    reduced) into ``dst`` of the result, an array of ``dtype`` (a contraction of at most 2048 only);
    ``tag`` names what ``fn`` computes (with every parameter it depends on).

    Big products (computed in row blocks) are shared between the programs of a trial
    (:mod:`verimirage.smt.ff.share`): inside :func:`~verimirage.smt.ff.share.storing` they are kept
    (read-only), inside :func:`~verimirage.smt.ff.share.finding` they are first looked up.
    """
    nd = max(a.ndim, b.ndim)
    a = a.reshape((1,) * (nd - a.ndim) + a.shape)
    b = b.reshape((1,) * (nd - b.ndim) + b.shape)
    nb = nd - 2
    both = [t for t in range(nb) if a.shape[t] == b.shape[t] and a.shape[t] > 1]
    a_only = [t for t in range(nb) if a.shape[t] > 1 and b.shape[t] == 1]
    b_only = [t for t in range(nb) if b.shape[t] > 1 and a.shape[t] == 1]
    bad = [t for t in range(nb) if a.shape[t] != b.shape[t] and a.shape[t] != 1 and b.shape[t] != 1]
    if bad:
        raise GraphError(f"ff matmul: batch dims {a.shape[:-2]} and {b.shape[:-2]} do not broadcast")
    ones_a = [t for t in range(nb) if t not in both and t not in a_only]
    ones_b = [t for t in range(nb) if t not in both and t not in b_only]
    mm, kk = a.shape[-2:]
    nn = b.shape[-1]
    n_both = math.prod(a.shape[t] for t in both)
    n_a = math.prod(a.shape[t] for t in a_only)
    n_b = math.prod(b.shape[t] for t in b_only)
    out: np.ndarray | None = None
    big = n_both * n_a * mm * n_b * nn >= _BLOCK_ELEMS and n_a * mm * n_b * nn >= _BLOCK_ELEMS // 4
    if epi is not None and kk > _CHUNK:
        raise GraphError(f"ff matmul: a block epilogue needs a contraction of at most {_CHUNK}, got {kk}")
    # (both, a_only, M, b_only, N): the batch axes in their order, then M, N
    r_shape = ([a.shape[t] for t in both] + [a.shape[t] for t in a_only] + [mm]
               + [b.shape[t] for t in b_only] + [nn])
    layout = ([a.shape[t] for t in both], [a.shape[t] for t in a_only] + [mm], [b.shape[t] for t in b_only] + [nn])
    blocked = kk <= _CHUNK and (big or epi is not None)
    fn, dt, tag = epi if epi is not None else ((lambda tb, dst: _f2i_into(tb, m, dst)), np.int64, ("mod", m))
    # the same dot products, computed by another program of this trial: first by where the operands lie (views
    # of the same read-only inputs), before they are folded or copied
    r = ffshare.find_aliased(tag, a.transpose([*both, *a_only, *ones_a, nb, nb + 1]),
                             b.transpose([*both, *ones_b, *b_only, nb + 1, nb]), layout) if blocked else None
    if r is not None:
        return _unfold(r, a.shape, b.shape, both, a_only, b_only, nb, mm, nn)
    af = _as_float(a, [*both, *a_only, *ones_a, nb, nb + 1], (n_both, n_a * mm, kk))
    bf = _as_float(b, [*both, *ones_b, nb, *b_only, nb + 1], (n_both, kk, n_b * nn))
    with _one_blas_thread():
        if blocked:
            # then by value (checked operand by operand)
            r = ffshare.find(tag, af, bf, layout)
            if r is None:
                out = ffgpu.product(af, bf, tag, _CHUNK)  # (on a GPU, when there is one)
                if out is None:
                    out = np.empty((n_both, n_a * mm, n_b * nn), dtype=dt)
                    _blocked_matmul(af, bf, out, fn)
                ffshare.store(tag, af, bf, out)
        elif kk <= _CHUNK:
            out = _f2i_mod(np.matmul(af, bf), m)
        else:
            out = ffgpu.product(af, bf, ("mod", m), _CHUNK)
            if out is None:
                out = _chunked_matmul_mod(af, bf, m)
    if r is None:
        assert out is not None
        r = out.reshape(r_shape)
    return _unfold(r, a.shape, b.shape, both, a_only, b_only, nb, mm, nn)


def _chunked_matmul_mod(af: np.ndarray, bf: np.ndarray, m: int) -> np.ndarray:
    """``af @ bf mod m`` (int64) of ``(n, M, K)`` and ``(n, K, N)`` float64 residues, one float64 product per
    contraction chunk of :data:`_CHUNK` (exact), summed in int64."""
    out: np.ndarray | None = None
    kk = af.shape[-1]
    for s in range(0, kk, _CHUNK):
        pi = np.matmul(af[..., s : s + _CHUNK], bf[:, s : s + _CHUNK, :]).astype(np.int64)
        out = pi if out is None else np.add(out, pi, out=out)
        if (s // _CHUNK) % 512 == 511:  # keep the int64 sum of chunk results below 2**63
            _modi(out, m)
    assert out is not None
    return _modi(out, m)


def _unfold(r: np.ndarray, a_shape: tuple[int, ...], b_shape: tuple[int, ...], both: list[int], a_only: list[int],
            b_only: list[int], nb: int, mm: int, nn: int) -> np.ndarray:
    """A product laid out (both, a_only, M, b_only, N) as the broadcast shape (batch axes in order, M, N)."""
    order = both + a_only + b_only  # the batch axis each of r's leading axes stands for
    pos = {t: i for i, t in enumerate(both + a_only)}
    pos.update({t: len(both) + len(a_only) + 1 + i for i, t in enumerate(b_only)})
    m_ax = len(both) + len(a_only)
    n_ax = r.ndim - 1
    perm = [pos[t] for t in sorted(order)] + [m_ax, n_ax]
    r = r.transpose(perm)
    full = (*tuple(max(a_shape[t], b_shape[t]) for t in range(nb)), mm, nn)
    return r.reshape(full)


def _modmatmul(a: np.ndarray, b: np.ndarray, m: int) -> np.ndarray:
    """Exact ``a @ b mod m`` of int residue arrays (m <= 2**21)."""
    return _matmul_mod(np.asarray(a % m, dtype=np.int64), np.asarray(b % m, dtype=np.int64), m)
