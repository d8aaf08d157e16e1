"""Where the time of one GPU finite-field product goes (verimirage/smt/ff/gpu.py), on a CUDA machine.

``python benchmarks/perf/ffgpu_micro.py``: gqa at batch 8's ``exp(Q K^T)`` product (16 x 256 x 4096 results,
contraction 64): the whole :func:`ffgpu.product` (its result page-locked, as a trial's, and in ordinary
memory), then its parts (upload of K, the product and exp lookup on the GPU, download into fresh, touched and
page-locked host memory), on one thread and on 4 threads at once (as 4 trials run). Medians of 7, in ms.
"""

from __future__ import annotations

import concurrent.futures
import os
import statistics
import time
from collections.abc import Callable

import numpy as np
import torch

from verimirage.smt import ff as FF
from verimirage.smt.ff import gpu as G
from verimirage.smt.ff import products as FFprod


def _ms(fn: Callable[[], object], reps: int = 7) -> float:
    ts = []
    for _ in range(reps):
        torch.cuda.synchronize()
        t = time.perf_counter()
        fn()
        torch.cuda.synchronize()
        ts.append((time.perf_counter() - t) * 1e3)
    return statistics.median(ts)


def _unpinned(fn: Callable[[], object]) -> object:
    cap, G.PINNED_BYTES = G.PINNED_BYTES, 0
    try:
        return fn()
    finally:
        G.PINNED_BYTES = cap


def main() -> None:
    """Print the table (see the module docstring)."""
    os.environ[G.DEVICE_ENV] = "cuda"
    fld = FF.Field.from_seed(1)
    rng = np.random.default_rng(0)
    af = rng.integers(0, fld.q, (16, 256, 64)).astype(np.float64)
    bf = rng.integers(0, fld.q, (16, 64, 4096)).astype(np.float64)
    tag = ("exp", fld.p, fld.q, fld.g)
    shape = (16, 256, 4096)
    dev = G.device()
    table = G._device_table(dev, fld.p, fld.q, fld.g)
    a_d, b_d = torch.from_numpy(af).to(dev), torch.from_numpy(bf).to(dev)
    res = table[torch.bmm(a_d, b_d).to(torch.int64).remainder_(fld.q)]
    touched = np.ones(shape)
    cpu_epi = FF.exp_epilogue(fld.p, fld.q, fld.g)
    pinned = torch.empty(shape, dtype=torch.float64, pin_memory=True)
    rows = {
        "product(), page-locked result": lambda: G.product(af, bf, tag, FFprod._CHUNK),
        "product(), ordinary memory": lambda: _unpinned(lambda: G.product(af, bf, tag, FFprod._CHUNK)),
        "upload K (34 MB)": lambda: torch.from_numpy(bf).to(dev),
        "bmm + mod + exp lookup on the GPU": lambda: table[torch.bmm(a_d, b_d).to(torch.int64).remainder_(fld.q)],
        "download 134 MB into a fresh array": lambda: torch.from_numpy(np.empty(shape)).copy_(res),
        "download into touched memory": lambda: torch.from_numpy(touched).copy_(res),
        "download into page-locked memory": lambda: pinned.copy_(res),
        "page-locked -> fresh array (CPU copy)": lambda: np.copyto(np.empty(shape), pinned.numpy()),
        "the CPU path (numpy)": lambda: FFprod._blocked_matmul(af, bf, np.empty(shape), cpu_epi),
    }
    print(f"device {torch.cuda.get_device_name()}; gqa b8 exp(Q K^T): median of 7, ms")
    for name, fn in rows.items():
        one = _ms(fn)
        with concurrent.futures.ThreadPoolExecutor(4) as ex:
            four = _ms(lambda fn=fn: list(ex.map(lambda _: fn(), range(4))))  # type: ignore[misc]
        print(f"  {name:36s} 1 thread {one:8.1f}   4 threads at once {four:8.1f}")


if __name__ == "__main__":
    main()
