"""The models section (issue 21): programs of real models, superoptimized, verified, compiled, checked."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

import verimirage as vm
from verimirage.benchmarks import get_model, model_names

FAST = {"gelu_mlp", "geglu", "batchnorm_relu"}


def _inputs(g: vm.Graph, rng: np.random.Generator) -> dict[str, np.ndarray]:
    out = {}
    for t in g.inputs:
        if t.dtype is vm.bool:
            out[t.name] = np.broadcast_to(np.tril(np.ones(t.shape[-2:], dtype=bool)), t.shape).copy()
        elif t.name == "VAR":  # running variances
            out[t.name] = rng.uniform(0.5, 2.0, t.shape)
        elif t.name == "T":  # one-hot targets
            out[t.name] = np.eye(t.shape[1])[rng.integers(0, t.shape[1], t.shape[0])]
        else:
            out[t.name] = rng.uniform(-1.5, 1.5, t.shape)
    return out


def test_models_are_listed_with_small_and_full_sizes() -> None:
    assert set(model_names()) >= {"logsumexp", "log_softmax", "cross_entropy", "causal_attention",
                                  "softcap_attention", "rotary_attention", "layernorm_linear", "gelu_mlp", "geglu",
                                  "group_norm", "batchnorm_relu", "activations", "swiglu_ffn", "residual_rmsnorm",
                                  "qkv_bias", "decode_gqa", "bias_attention", "lora_scaled"}
    for n in model_names():
        small, full = get_model(n, small=True), get_model(n)
        assert str(small) != str(full) and len(small.nodes) == len(full.nodes)
    with pytest.raises(vm.GraphError, match="unknown model"):
        get_model("nope")


@pytest.mark.parametrize("name", [pytest.param(n, marks=() if n in FAST else pytest.mark.slow) for n in model_names()])
def test_model_is_superoptimized_verified_compiled_and_correct(name: str, tmp_path: Path) -> None:
    torch = pytest.importorskip("torch")
    g = get_model(name, small=True, dtype=vm.float32)
    res = vm.superoptimize(g, time_budget_s=60, max_verify=2, cache=False)
    assert res.candidates, res.report
    best = res.best
    assert isinstance(best.verdict, vm.Proved)
    best.certificate.save(tmp_path / "c.json")  # the independent checker re-checks it
    assert isinstance(vm.check_certificate(tmp_path / "c.json"), vm.Proved)
    ins = _inputs(g, np.random.default_rng(0))
    want = vm.evaluate(g, ins)
    out = vm.compile(best)(*[torch.tensor(ins[t.name]).to(getattr(torch, t.dtype.torch_name)) for t in g.inputs])
    outs = out if isinstance(out, tuple) else (out,)
    for o, w in zip(outs, want, strict=True):
        np.testing.assert_allclose(o.double().numpy(), w, rtol=2e-4, atol=2e-4)


def test_the_reference_meanings_of_the_models() -> None:
    torch = pytest.importorskip("torch")
    F = torch.nn.functional
    rng = np.random.default_rng(1)
    g = get_model("cross_entropy", small=True)
    ins = _inputs(g, rng)
    want = F.cross_entropy(torch.tensor(ins["X"]), torch.tensor(ins["T"]).argmax(1)).item()
    np.testing.assert_allclose(vm.evaluate(g, ins)[0].item(), want, rtol=1e-12)
    g = get_model("log_softmax", small=True)
    x = rng.standard_normal((4, 64))
    np.testing.assert_allclose(vm.evaluate(g, {"X": x})[0], F.log_softmax(torch.tensor(x), 1).numpy(), rtol=1e-12)
    g = get_model("gelu_mlp", small=True)
    ins = _inputs(g, rng)
    h = torch.tensor(ins["X"]) @ torch.tensor(ins["W1"])
    want = (F.gelu(h) @ torch.tensor(ins["W2"])).numpy()
    np.testing.assert_allclose(vm.evaluate(g, ins)[0], want, rtol=1e-10, atol=1e-12)
    g = get_model("causal_attention", small=True)
    ins = _inputs(g, rng)
    q, k, v = (torch.tensor(ins[n]) for n in "QKV")
    want = F.scaled_dot_product_attention(q, k.transpose(1, 2), v, is_causal=True, scale=1.0).numpy()
    np.testing.assert_allclose(vm.evaluate(g, ins)[0], want, rtol=1e-9, atol=1e-12)


def test_norms_and_activations_match_torch() -> None:
    torch = pytest.importorskip("torch")
    F = torch.nn.functional
    rng = np.random.default_rng(2)
    g = get_model("group_norm", small=True)
    ins = _inputs(g, rng)
    x = torch.tensor(ins["X"])
    want = F.group_norm(x, 8, torch.tensor(ins["G"][:, 0]), torch.tensor(ins["B"][:, 0]), eps=1e-5).numpy()
    np.testing.assert_allclose(vm.evaluate(g, ins)[0], want, rtol=1e-9, atol=1e-12)
    g = get_model("batchnorm_relu", small=True)
    ins = _inputs(g, rng)
    t = {k: torch.tensor(v[:, 0]) if k != "X" else torch.tensor(v) for k, v in ins.items()}
    want = F.relu(F.batch_norm(t["X"], t["MEAN"], t["VAR"], t["G"], t["B"], training=False, eps=1e-5)).numpy()
    np.testing.assert_allclose(vm.evaluate(g, ins)[0], want, rtol=1e-9, atol=1e-12)
    g = get_model("activations", small=True)
    ins = _inputs(g, rng)
    h = torch.tensor(ins["X"]) @ torch.tensor(ins["W"])
    for got, want in zip(vm.evaluate(g, ins), (F.mish(h), F.hardswish(h), F.silu(h)), strict=True):
        np.testing.assert_allclose(got, want.numpy(), rtol=1e-9, atol=1e-12)


def test_plain_and_max_shifted_logsumexp_are_proved_equal() -> None:
    """log's q-part in the field is exp's exact inverse (and the abstract check takes exp factors out of a
    log), so the max-shifted logsumexp is proved equal to the plain one (tests/test_verify_log.py has more)."""
    from verimirage.benchmarks.models import logsumexp

    a, b = vm.Graph(), vm.Graph()
    xa, xb = a.input("X", (4, 16), vm.float32), b.input("X", (4, 16), vm.float32)
    a.output(logsumexp(a, xa, 1))
    b.output(logsumexp(b, xb, 1, stable=False))
    assert isinstance(vm.verify(a, b), vm.Proved)
