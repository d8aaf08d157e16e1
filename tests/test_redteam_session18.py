"""Red team, eighteenth session: each test is named after what went wrong and fails on the code before its fix."""

from __future__ import annotations

import glob
import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import verimirage as vm

ROOT = Path(__file__).resolve().parents[1]
#: the suite's attention cases (benchmarks/candidates, proofs/): Q K^T V with Q, K, V inputs, no mask input
SUITE_ATTENTION = ("mha", "gqa", "mqa", "qknorm_gqa", "mha_stable", "gqa_stable")


def _suite_attention_texts() -> list[tuple[str, str]]:
    out = []
    for name in SUITE_ATTENTION:
        for b in (1, 8):
            doc = json.loads((ROOT / "benchmarks" / "candidates" / f"{name}_bs{b}.json").read_text())
            out += [(f"candidates/{name}_bs{b}.json#{r}", c["mugraph"]) for r, c in enumerate(doc["candidates"])]
            cert = ROOT / "proofs" / f"{name}_bs{b}.json"
            out.append((f"proofs/{name}_bs{b}.json", json.loads(cert.read_text())["mugraph_text"]))
    return out


def test_suite_attention_candidates_and_proofs_kept_the_unfloored_running_max() -> None:
    """Red team 17 floored the models set's online softmaxes (partition.RUNNING_MAX_FLOOR); the suite's attention
    candidates and certificates kept the old form, NaN on every row whose first key tiles score -inf (see the
    next test). Every stored one is now a fixed point of the floor."""
    from verimirage.rewrite.floor import floor_running_maxes

    unfloored = [where for where, text in _suite_attention_texts()
                 if floor_running_maxes(mg := vm.MuGraph.parse(text)) is not mg]
    assert not unfloored, unfloored


#: stored μGraphs whose running max stays unfloored, and why no input makes them NaN where their source is finite
UNFLOORED_WHY = {
    "benchmarks/candidates/layer/decode_bs1.json": "each split's max is maximum(tile max, q . k_new): the new token's "
                                                   "score, finite for finite activations, so no split's max is -inf",
    "proofs/layer_decode_bs1.json": "the same design as benchmarks/candidates/layer/decode_bs1.json #0",
    "benchmarks/candidates/layer/proofs/layer_decode_bs1_rot_parts.json": "the same attention as the bs1 file's #0",
    "benchmarks/candidates/layer/proofs/layer_decode_bs1_s19.json": "the same attention as the bs1 file's #0",
    "benchmarks/candidates_models/cross_entropy_prefill.json": "dense targets: T * -(X - lse) is 0 * inf = NaN (or "
                                                               "inf) in the source wherever a logit is -inf",
    "benchmarks/candidates_causal_cmp/bias_attention.json": "timing comparison only (BENCHMARKS.md), not a pick",
    "benchmarks/candidates_causal_cmp/causal_attention.json": "timing comparison only (BENCHMARKS.md), not a pick",
    "benchmarks/candidates_causal_cmp/softcap_attention.json": "timing comparison only (BENCHMARKS.md), not a pick",
}


def test_every_stored_online_softmax_is_floored_or_listed_with_a_reason() -> None:
    """Every committed candidate and certificate with a running max is in the floored form, or listed in
    ``UNFLOORED_WHY`` with the reason no input reaches the NaN (a new unfloored one, or a listed file that no longer
    needs its entry, fails here)."""
    from verimirage.rewrite.floor import floor_running_maxes

    files = sorted({*glob.glob(str(ROOT / "benchmarks" / "candidates*" / "**" / "*.json"), recursive=True),
                    *glob.glob(str(ROOT / "proofs" / "*.json"))})
    unfloored = set()
    for f in files:
        doc = json.loads(Path(f).read_text())
        texts = [c["mugraph"] for c in doc["candidates"]] if "candidates" in doc else [doc.get("mugraph_text", "")]
        if any("running_max" in t and floor_running_maxes(mg := vm.MuGraph.parse(t)) is not mg for t in texts):
            unfloored.add(str(Path(f).relative_to(ROOT)))
    listed = set(UNFLOORED_WHY)
    assert unfloored == listed, (sorted(unfloored - listed), sorted(listed - unfloored))


@pytest.mark.parametrize("case", ["gqa_stable_bs1", "mha_stable_bs1"])
def test_suite_attention_proof_gave_nan_where_the_first_key_tiles_score_minus_inf(case: str) -> None:
    """``softmax(Q K) V`` (the certified design and the best stored candidate: online softmax over key tiles, split-KV)
    with the first 1024 of 4096 keys -inf in one feature and that feature of every query positive: each row scores
    -inf on its first key tiles and finitely on the rest. The graph in float64 (and ATen) gives finite rows; the
    unfloored running max took ``exp(-inf - (-inf)) = NaN`` into every output (the stored gqa_stable_bs1 candidate's
    Triton kernels in the interpreter: 32768 NaN of 32768). The μGraphs evaluated in float64 (the kernels' meaning)."""
    cert = json.loads((ROOT / "proofs" / f"{case}.json").read_text())
    best = json.loads((ROOT / "benchmarks" / "candidates" / f"{case}.json").read_text())["candidates"][0]["mugraph"]
    g = vm.Graph.parse(cert["graph_text"])
    shapes = {str(t.name): t.shape for t in g.inputs}
    rng = np.random.default_rng(0)
    ins = {n: rng.uniform(-1, 1, s).astype(np.float16).astype(np.float64) for n, s in shapes.items()}
    ins["Q"][..., 0] = np.abs(ins["Q"][..., 0]) + 0.125
    ins["K"][:, 0, :1024] = -np.inf
    want = vm.evaluate(g, ins)[0]
    assert np.isfinite(want).all()
    for what, text in (("certificate", cert["mugraph_text"]), ("best candidate", best)):
        got = vm.evaluate(vm.MuGraph.parse(text), ins)[0]
        assert not np.isnan(got).any(), f"{what}: {int(np.isnan(got).sum())} NaN of {got.size}"
        np.testing.assert_allclose(got, want, rtol=1e-9, atol=1e-12)


@pytest.mark.parametrize("nd", [1, 2])
def test_single_channel_convolution_weight_gradient_multiplied_across_the_batch(nd: int) -> None:
    """A convolution of one input and one output channel is depthwise (``conv.Conv.depthwise``), but with one group the
    lifting reshaped the output gradient to ``(N, O, positions)``, the non-depthwise form: the depthwise weight
    gradient's product with the ``(N, C, offsets, positions)`` columns then broadcast the batch against the channels
    (N x N terms) and the result had N times the weight's elements; the capture's shape check sent it back to ATen
    ("lifted (1, 2, 3, 1) for (1, 1, 3)"). Now it lifts and equals ATen's in float64."""
    torch = pytest.importorskip("torch")
    from test_capture_ops import _lift_and_compare, _x

    aten = torch.ops.aten
    s = [1] * nd
    x, w = _x(2, 1, *(7,) * nd), _x(1, 1, *(3,) * nd, seed=1)
    gy = _x(*aten.convolution(x, w, None, s, s, s, False, [0] * nd, 1).shape, seed=3)

    def fb(gy: Any, x: Any, w: Any) -> list[Any]:
        r = aten.convolution_backward(gy, x, w, [1], s, s, s, False, [0] * nd, 1, [True, True, True])
        return list(r)

    _lift_and_compare(fb, gy, x, w)
