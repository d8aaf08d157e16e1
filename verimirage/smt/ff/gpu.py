"""Big finite-field products on a GPU, when the machine has one (``$VERIMIRAGE_FF_DEVICE``).

The finite-field test's largest cost is the products of residue arrays (attention's ``Q K^T`` of a batch-8
pair is 1.07 G multiply-adds a trial), and, for ``exp`` of a product, reducing each result mod q and looking
it up in the exp table. On a machine with an NVIDIA GPU these run there, through torch, and the results are
copied back into host arrays of the same layout as the CPU path's, so nothing else changes: later ops, the
sharing of products between programs (:mod:`verimirage.smt.ff.share`) and the verdict are the same.

Exactness is argued as on the CPU: the operands are integer residues held in float64, the contraction is
split into chunks of at most ``products._CHUNK`` (2048) so that every partial sum of products is an integer below
2**53, and float64 arithmetic is exact on such integers whatever the order of summation or use of fused
multiply-adds (so cuBLAS's choice of algorithm cannot change a result); the conversion to int64, the sums of
chunk results, the reduction mod m and the exp-table lookup are integer operations. A test on the GPU
machine compares every element with the CPU path (``tests/test_verify_ff_gpu.py``), and every product is
spot-checked where it is made: :data:`SPOT_CHECKS` random elements recomputed exactly on the CPU (a device
that rounded, e.g. through an emulated float64 mode, would differ there; the products then go to the CPU).

``$VERIMIRAGE_FF_DEVICE``:

* ``auto`` (the default): the current CUDA GPU when this process has already started CUDA through torch (a
  search with ``profile=True`` starts it in the background), else the CPU. Starting CUDA costs seconds (3.6 s on
  the H100 machine), more than the GPU saves on a pair (gqa at batch 8: ~0.4 s cold), so a one-off
  ``vm.verify`` does not start it;
* ``cpu``: numpy on the CPU only;
* ``cuda`` or ``cuda:N``: that GPU (an error when there is none);
* ``torch-cpu``: the GPU code path run by torch on the CPU (for testing it on a machine without a GPU; slower
  than numpy).
"""

from __future__ import annotations

import logging
import math
import os
import sys
import threading
import warnings
import weakref
from functools import lru_cache
from typing import Any

import numpy as np

from ...ir.errors import GraphError

log = logging.getLogger(__name__)

DEVICE_ENV = "VERIMIRAGE_FF_DEVICE"
#: a product of fewer multiply-adds stays on the CPU (moving it would cost more than computing it)
MIN_MACS = 1 << 24
#: result elements computed per step on the device (bounds the device memory a trial's product takes)
SLAB_ELEMS = 1 << 24
#: sums of this many chunk results are reduced mod m (each is < 2**53: 512 of them stay below 2**62)
_REDUCE_EVERY = 512
#: elements of every device product recomputed exactly on the CPU
SPOT_CHECKS = 64
#: page-locked result arrays alive at once, at most (torch keeps freed blocks for reuse, so this also bounds
#: the page-locked memory the process holds, up to its rounding of block sizes)
PINNED_BYTES = 4 << 30

_lock = threading.Lock()
_resolved: dict[str, Any] = {}
_announced: set[Any] = set()
_pinned = 0
_warned: set[str] = set()  # devices whose failure was logged
_failures = 0


def _torch() -> Any:
    import torch

    return torch


def setting() -> str:
    """``$VERIMIRAGE_FF_DEVICE``, normalised (``auto`` when unset or blank)."""
    return os.environ.get(DEVICE_ENV, "").strip().lower() or "auto"


def device() -> Any | None:
    """The torch device the big products run on, or None for numpy on the CPU (GraphError for a setting that
    names a device this machine does not have)."""
    s = setting()
    if s == "cpu":
        return None
    if s == "auto":
        torch = sys.modules.get("torch")  # (not imported here: if torch is not loaded, CUDA is not started)
        if torch is None or not torch.cuda.is_initialized():
            return None
        dev = torch.device("cuda", torch.cuda.current_device())
    else:
        with _lock:
            if s not in _resolved:
                _resolved[s] = _resolve(s)
            dev = _resolved[s]
    if dev not in _announced:
        with _lock:
            if not _announced:
                # torch warns when it views a read-only array (trial inputs are frozen); the views made here are
                # only read (installed on first use, not at import)
                warnings.filterwarnings("ignore", message="The given NumPy array is not writable",
                                        category=UserWarning, module=__name__.replace(".", r"\."))
            _announced.add(dev)
        log.info("finite-field products of at least %d multiply-adds run on %s", MIN_MACS, dev)
    return dev


def _resolve(s: str) -> Any:
    """The torch device an explicit setting names."""
    if s == "torch-cpu" or s == "cuda" or s.startswith("cuda:"):
        try:
            torch = _torch()
        except ImportError as e:
            raise GraphError(f"${DEVICE_ENV}={s!r} needs torch, which cannot be imported ({e})") from e
        if s == "torch-cpu":
            return torch.device("cpu")
        if not torch.cuda.is_available():
            raise GraphError(f"${DEVICE_ENV}={s!r}, but torch sees no CUDA GPU on this machine; "
                             "expected auto or cpu here")
        try:
            dev = torch.device(s)
        except (RuntimeError, ValueError) as e:
            raise GraphError(f"${DEVICE_ENV}={s!r}: not a device name ({e}); expected cuda or cuda:N") from e
        n = torch.cuda.device_count()
        if dev.index is None:
            return torch.device("cuda", torch.cuda.current_device())
        if not 0 <= dev.index < n:
            raise GraphError(f"${DEVICE_ENV}={s!r}: this machine has {n} CUDA GPU(s) (cuda:0 to cuda:{n - 1})")
        return dev
    raise GraphError(f"${DEVICE_ENV}={s!r}: expected auto, cpu, cuda, cuda:N or torch-cpu")


def start_cuda_in_background() -> threading.Thread | None:
    """Start CUDA through torch on a daemon thread, when ``$VERIMIRAGE_FF_DEVICE`` is ``auto`` and torch sees a
    GPU; the thread, or None when nothing is started. A search that will profile its kernels on the GPU starts
    CUDA anyway: started while the search rewrites and lowers, it lets the verification phase that follows
    put its products on the GPU (``auto`` uses a GPU only once CUDA is started)."""
    if setting() != "auto":
        return None
    try:
        torch = _torch()
    except ImportError:
        return None
    if torch.cuda.is_initialized() or not torch.cuda.is_available():
        return None
    t = threading.Thread(target=_start_cuda, args=(torch,), name="vm-cuda-start", daemon=True)
    t.start()
    return t


def _start_cuda(torch: Any) -> None:
    try:
        torch.cuda.init()
    except Exception as e:  # (the products stay on the CPU; profiling will report its own error)
        log.warning("could not start CUDA for the finite-field products: %s", e)


def describe() -> str:
    """Where big products run, for a verdict's evidence: ``cpu`` or e.g. ``cuda:0 (NVIDIA H100 80GB HBM3)``."""
    dev = device()
    if dev is None:
        return "cpu"
    if dev.type != "cuda":
        return f"torch-{dev.type}"
    return f"cuda:{dev.index} ({_torch().cuda.get_device_name(dev.index)})"  # (device() gives an index)


@lru_cache(maxsize=16)
def _device_table(dev: Any, p: int, q: int, g: int) -> Any:
    from .field import _exp_table

    return _tensor(_exp_table(p, q, g).astype(np.float64)).to(dev)


def _tensor(a: np.ndarray) -> Any:
    """A torch view of host array ``a`` (read-only arrays too: the view is only read)."""
    return _torch().from_numpy(a)


def product(af: np.ndarray, bf: np.ndarray, tag: tuple[Any, ...], chunk: int) -> np.ndarray | None:
    """``af @ bf`` (``(n, M, K)`` and ``(n, K, N)`` float64 residues) reduced as ``tag`` says, computed on the
    device, as a new host array ``(n, M, N)``: ``("mod", m)``: int64 residues mod m; ``("exp", p, q, g)``:
    float64 ``g ** (x mod q) mod p``. ``chunk``: the longest contraction whose float64 partial sums are exact.
    None when there is no device, the product is small, the tag is another, or the device fails (out of memory,
    say: logged once per device; the CPU path then computes the same values).

    The result lives in page-locked host memory while :data:`PINNED_BYTES` allows (see :func:`host_empty`)."""
    n, rows, kk = af.shape
    cols = bf.shape[-1]
    if tag[0] not in ("mod", "exp") or n * rows * cols * kk < MIN_MACS:
        return None
    dev = device()
    if dev is None:
        return None
    if tag[0] == "exp" and kk > chunk:
        raise GraphError(f"ff matmul: a fused exp needs a contraction of at most {chunk}, got {kk}")
    try:
        return _product_on(dev, af, bf, tag, chunk)
    except RuntimeError as e:  # (out of device memory, a busy or failing GPU: the CPU computes the same values)
        global _failures
        with _lock:
            _failures += 1
        if str(dev) not in _warned:
            _warned.add(str(dev))
            log.warning("finite-field products on %s failed (%s); computing them on the CPU", dev,
                        str(e).splitlines()[0] if str(e) else type(e).__name__)
        return None


def failures() -> int:
    """How many products the device failed (and the CPU computed instead) in this process."""
    return _failures


def _product_on(dev: Any, af: np.ndarray, bf: np.ndarray, tag: tuple[Any, ...], chunk: int) -> np.ndarray:
    n, rows, kk = af.shape
    cols = bf.shape[-1]
    torch = _torch()
    m = int(tag[1]) if tag[0] == "mod" else int(tag[2])
    if dev.type == "cuda":
        torch.cuda.set_device(dev)  # (a trial's worker thread: its CUDA context, before cuBLAS looks for one)
    table = _device_table(dev, *(int(t) for t in tag[1:])) if tag[0] == "exp" else None
    out, host = host_empty((n, rows, cols), np.float64 if table is not None else np.int64, dev)
    b_dev = _tensor(bf).to(dev)
    # steps: several batch items at once when one is small, else row blocks of one item
    per_item = rows * cols
    items = max(1, min(n, SLAB_ELEMS // max(per_item, 1)))
    row_step = rows if items > 1 or per_item <= SLAB_ELEMS else max(1, SLAB_ELEMS // max(cols, 1))
    for i0 in range(0, n, items):
        i1 = min(n, i0 + items)
        for r0 in range(0, rows, row_step):
            r1 = min(rows, r0 + row_step)
            a_dev = _tensor(af[i0:i1, r0:r1]).to(dev)
            acc = None
            for c, s in enumerate(range(0, kk, chunk)):
                part = torch.bmm(a_dev[:, :, s : s + chunk], b_dev[i0:i1, s : s + chunk]).to(torch.int64)
                acc = part if acc is None else acc.add_(part)
                if c % _REDUCE_EVERY == _REDUCE_EVERY - 1:
                    acc.remainder_(m)
            assert acc is not None
            acc.remainder_(m)
            host[i0:i1, r0:r1].copy_(acc if table is None else table[acc])
    _spot_check(af, bf, out, tag, m)
    return out


def _spot_check(af: np.ndarray, bf: np.ndarray, out: np.ndarray, tag: tuple[Any, ...], m: int) -> None:
    """RuntimeError unless :data:`SPOT_CHECKS` random elements of ``out`` equal their exact values."""
    n, rows = af.shape[:2]
    rng = np.random.default_rng()
    i, r, c = (rng.integers(0, d, SPOT_CHECKS) for d in (n, rows, bf.shape[-1]))
    a = af[i, r, :].astype(np.int64) % m
    b = bf[i, :, c].astype(np.int64) % m
    exact = (a * b % m).sum(axis=-1) % m  # (products < 2**42, each reduced before the sum)
    if tag[0] == "exp":
        from .field import _exp_table

        exact = _exp_table(*(int(t) for t in tag[1:]))[exact]
    got = out[i, r, c]
    if not np.array_equal(got, exact):
        k = int(np.argmax(got != exact))
        raise RuntimeError(f"a product element differs from its exact value: {tag[0]} at ({i[k]}, {r[k]}, {c[k]}): "
                           f"{got[k]} instead of {exact[k]}")


def host_empty(shape: tuple[int, ...], dtype: Any, dev: Any) -> tuple[np.ndarray, Any]:
    """A new host array for results from ``dev``, and a torch view of it to copy them into.

    For a CUDA device, page-locked memory from torch's caching host allocator while the page-locked arrays
    alive stay within :data:`PINNED_BYTES`: copies into it run at the link's speed, and a block freed by an
    earlier array is reused without the kernel mapping fresh pages (writing 128 MiB of fresh memory took
    53 ms on the H100 machine's host, 200 ms each with 4 trials at once; into page-locked memory, 3 ms).
    The array keeps its memory alive (its views do too); otherwise ordinary memory."""
    torch = _torch()
    nbytes = math.prod(shape) * np.dtype(dtype).itemsize
    global _pinned
    if dev.type == "cuda":
        with _lock:
            ok = _pinned + nbytes <= PINNED_BYTES
            if ok:
                _pinned += nbytes
        if ok:
            t = torch.empty(shape, dtype=torch.float64 if dtype == np.float64 else torch.int64, pin_memory=True)
            arr = t.numpy()
            weakref.finalize(arr, _unpin, nbytes)  # (views of arr keep arr, so this runs when the last is gone)
            return arr, t
    arr = np.empty(shape, dtype=dtype)
    return arr, torch.from_numpy(arr)


def _unpin(nbytes: int) -> None:
    global _pinned
    with _lock:
        _pinned -= nbytes


def pinned_bytes() -> int:
    """Bytes of page-locked result arrays alive now."""
    return _pinned
