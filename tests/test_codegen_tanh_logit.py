"""A soft cap's tanh read only as a softmax's logits is emitted as ``_vm_tanh_logit`` (issue 22, attn18): tanh's
``(1 - e) / (1 + e)`` form alone, accurate to 2**-21 absolute, without the accurate helper's small-argument
polynomial (11% of softcap attention's time on the H100). Which tanh nodes qualify, the helper's accuracy, and
that the kernels match float64 in the interpreter."""

from __future__ import annotations

import importlib.util
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import verimirage as vm
from verimirage.backend.codegen import generate
from verimirage.backend.lowering import HELPERS

pytest.importorskip("egglog")  # the search (rewrite/) needs it; the GPU machine has none
from test_codegen_exp2 import D, H, N, _fused


def _softcap(cap: float, times_input: bool = False) -> vm.Graph:
    """softmax(cap * tanh(Q K / cap)) V, fp16; ``times_input``: the capped logits times an input first."""
    g = vm.Graph()
    q, k, v = g.input("Q", (H, N, D), vm.float16), g.input("K", (H, D, N), vm.float16), g.input(
        "V", (H, N, D), vm.float16)
    s = g.scale(g.tanh(g.scale(g.matmul(q, k), 1.0 / cap)), cap)
    if times_input:
        s = g.mul(s, g.input("Y", (H, N, N), vm.float16))
    s = g.sub(s, g.max(s, axis=2))
    e = g.exp(s)
    g.output(g.matmul(g.div(e, g.sum(e, axis=2)), v))
    return g


@pytest.mark.parametrize("frange", [1, 2])  # one tile (max) and the online softmax (running_max)
def test_a_soft_capped_softmax_reads_tanh_in_its_short_form_and_matches_float64(frange: int) -> None:
    torch = pytest.importorskip("torch")
    g = _softcap(50.0)
    mg = _fused(g, frange)
    src = generate(mg).source
    assert "_vm_tanh_logit(" in src and "_vm_tanh(" not in src, src
    rng = np.random.default_rng(5)
    # scale 0.05: every tanh argument below 0.3125 (where the short form is not relatively accurate);
    # scale 30: logits up to the cap, tanh saturated
    for scale in (0.05, 1.0, 30.0):
        ins = {"Q": rng.uniform(-1, 1, (H, N, D)) * scale, "K": rng.uniform(-1, 1, (H, D, N)),
               "V": rng.uniform(-1, 1, (H, N, D))}
        ins = {n: x.astype(np.float16).astype(np.float64) for n, x in ins.items()}
        ins["Q"][1, 3, 0] = np.nan
        want = vm.evaluate(g, ins)[0]
        out = vm.compile(mg)(*[torch.tensor(ins[t.name], dtype=torch.float16) for t in mg.inputs])
        got = (out[0] if isinstance(out, (tuple, list)) else out).double().numpy()
        assert np.array_equal(np.isnan(got), np.isnan(want)) and np.isnan(want[1, 3]).all()
        np.testing.assert_allclose(got, want, rtol=4e-3, atol=2e-3, equal_nan=True)


@pytest.mark.parametrize("case", ["cap_too_large", "times_input"])
def test_a_tanh_read_otherwise_keeps_the_accurate_helper(case: str) -> None:
    """A cap of 1000 would scale the short form's 2**-21 into logit errors of 5e-4 (codegen.LOGIT_TANH_MAX_SCALE
    is 256); logits times another value are no longer moved by a bounded amount: both keep ``_vm_tanh``."""
    g = _softcap(1000.0) if case == "cap_too_large" else _softcap(50.0, times_input=True)
    src = generate(_fused(g, 1)).source
    assert "_vm_tanh(" in src and "_vm_tanh_logit(" not in src, src


def test_the_short_tanh_is_accurate_to_2_to_the_minus_21_absolute(tmp_path: Path) -> None:
    """``_vm_tanh_logit`` in the interpreter against float64 over x in +-[1e-30, 100] log-spaced, a fine grid of
    [-12, 12] and 0: absolute error at most 2**-21; +-1 at +-inf, NaN at NaN."""
    torch = pytest.importorskip("torch")
    import triton

    mod_path = tmp_path / "tanh_logit_mod.py"
    mod_path.write_text("import triton\nimport triton.language as tl\n\n\n" + HELPERS["_vm_tanh_logit"] + '''

@triton.jit
def k(x_ptr, o_ptr, n, B: tl.constexpr):
    i = tl.program_id(0) * B + tl.arange(0, B)
    tl.store(o_ptr + i, _vm_tanh_logit(tl.load(x_ptr + i, mask=i < n)), mask=i < n)
''')
    spec = importlib.util.spec_from_file_location("tanh_logit_mod", mod_path)
    assert spec is not None and spec.loader is not None
    m: Any = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(m)
    mags = np.logspace(-30, 2, 4001)
    xs = np.concatenate([mags, -mags, np.linspace(-12, 12, 24001), [0.0, np.inf, -np.inf, np.nan]])
    x = torch.tensor(xs, dtype=torch.float32)
    o = torch.empty_like(x)
    m.k[(triton.cdiv(len(xs), 1024),)](x, o, len(xs), B=1024)
    got, want = o.double().numpy(), np.tanh(x.double().numpy())
    np.testing.assert_array_equal(np.isnan(got), np.isnan(want))
    fin = ~np.isnan(want)
    err = np.abs(got[fin] - want[fin])
    assert err.max() <= 2.0**-21, (xs[fin][np.argmax(err)], err.max())
    assert got[-3] == 1.0 and got[-2] == -1.0
