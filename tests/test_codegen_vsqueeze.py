"""P @ V's V tile loaded as the rank-2 ``tl.dot`` operand beside the reshaped P in a rank-3 attention kernel that
also streams an additive bias (issue 22, bias_attention; ``codegen._KernelGen.dot_operand_inputs``): only for the
(128, 64) @ (64, 64) and (64, 64) @ (64, 64) products (``codegen.SQUEEZE_BESIDE_RESHAPE``), whose kernels compile for
sm_90 (other tile shapes fail in Triton 3.6's layout pass; the 64-row one at 8 warps too, which the runtime then
compiles at 4); the kernels still match float64 in the interpreter."""

from __future__ import annotations

import itertools
import json
import re
from pathlib import Path

import numpy as np
import pytest

import verimirage as vm
from verimirage.backend.codegen import generate

CANDS = Path(__file__).resolve().parents[1] / "benchmarks" / "candidates_models" / "bias_attention.json"
V_RANK2 = re.compile(r"v2 = tl\.load\(a2_ptr [^\n]*\(it \* 64 \+ tl\.arange\(0, 64\)\[:, None\]\) \* a2_s1 \+ "
                     r"\(tl\.arange\(0, 64\)\[None, :\]\) \* a2_s2\)")


def _stored(idx: int) -> str:
    return str(json.loads(CANDS.read_text())["candidates"][idx]["mugraph"])


def _small(text: str) -> str:
    """The stored 16-head, 1024-token design with its tiles kept: 1 head, 256 queries, 128 keys (2 x 2 blocks of 128
    rows, 4 x 2 of 64)."""
    for a, b in (("[16,1024,1024]", "[1,256,128]"), ("[16,1024,64]", "[1,256,64]"), ("[16,64,1024]", "[1,64,128]"),
                 ("(16, 1024, 1024)", "(1, 256, 128)"), ("(16, 64, 1024)", "(1, 64, 128)"),
                 ("frange=16, grid=(16, 8)", "frange=2, grid=(1, 2)"),
                 ("frange=16, grid=(16, 16)", "frange=2, grid=(1, 4)")):
        text = text.replace(a, b)
    # V is [16,1024,64] like Q: its 1024 rows are the keys
    text = re.sub(r"(%2 = input \{name='V'\} : f16)\[1,256,64\]", r"\1[1,128,64]", text)
    text = re.sub(r"(%2 = input \{arg=2, fmap=1, imap=\(0, None\), shape=)\(16, 1024, 64\)", r"\1(1, 128, 64)", text)
    return text.replace("(16, 1024, 64)", "(1, 256, 64)")


@pytest.mark.parametrize("idx", [0, 1])  # 128 and 64 rows by 64 keys
def test_the_64_key_bias_designs_load_v_as_the_dot_operand(idx: int) -> None:
    src = generate(vm.MuGraph.parse(_stored(idx))).source
    assert V_RANK2.search(src), "V is not loaded at rank 2"
    assert "tl.reshape(v2" not in src
    assert "tl.reshape(tl.dot(x5, y6" in src  # P @ V itself is still reshaped back to rank 3


@pytest.mark.parametrize("idx", [2, 3])  # 32- and 128-key tiles: Triton 3.6 rejects V squeezed there
def test_other_bias_designs_keep_v_at_rank_3(idx: int) -> None:
    src = generate(vm.MuGraph.parse(_stored(idx))).source
    assert not V_RANK2.search(src)
    assert "tl.reshape(v2" in src


@pytest.mark.parametrize("idx", [0, 1])
def test_the_squeezed_v_kernel_matches_float64_in_the_interpreter(idx: int) -> None:
    torch = pytest.importorskip("torch")
    mg = vm.MuGraph.parse(_small(_stored(idx)))
    src = generate(mg).source
    assert V_RANK2.search(src)
    rng = np.random.default_rng(7)
    q, k, v = rng.normal(0, 0.5, (1, 256, 64)), rng.normal(0, 0.5, (1, 64, 128)), rng.normal(0, 1, (1, 128, 64))
    bias = rng.normal(0, 2, (1, 256, 128))
    ins = [torch.tensor(x, dtype=torch.float16) for x in (q, k, v, bias)]
    got = vm.compile(mg)(*ins)
    got = (got[0] if isinstance(got, (tuple, list)) else got).double().numpy()
    q, k, v, bias = (x.double().numpy() for x in ins)
    s = q @ k + bias
    p = np.exp(s - s.max(-1, keepdims=True))
    ref = (p / p.sum(-1, keepdims=True)) @ v
    assert np.isfinite(got).all()
    assert np.linalg.norm(got - ref) / np.linalg.norm(ref) < 2e-3


@pytest.mark.slow
def test_the_squeezed_v_kernel_compiles_for_sm90(tmp_path: Path) -> None:
    """Triton 3.6's layout pass accepts V squeezed beside the reshaped P for these designs (it rejects other tile
    shapes: the reason for the shape condition), in each dtype, at 4 warps (and 8 for 128 rows), 3 stages."""
    pytest.importorskip("triton")
    from verimirage.backend.gpucompile import compile_modules

    paths = []
    for dtype, idx in itertools.product(("f16", "bf16", "f32"), (0, 1)):
        src = generate(vm.MuGraph.parse(_stored(idx).replace("f16[", f"{dtype}["))).source
        assert V_RANK2.search(src)
        for warps in (4, 8) if idx == 0 else (4,):  # (64 rows at 8 warps: the runtime compiles them at 4)
            launch = "'k4': {'num_warps': 4, 'num_stages': 2}"
            assert launch in src
            path = tmp_path / f"bias{idx}_{dtype}_w{warps}.py"
            path.write_text(src.replace(launch, f"'k4': {{'num_warps': {warps}, 'num_stages': 3}}"))
            paths.append(path)
    rep = compile_modules(paths)
    bad = {p: r for p, r in rep.items() if not all(k["ok"] for k in r.values())}
    assert not bad, bad
