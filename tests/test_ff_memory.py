"""Memory of the fast finite-field test on a K-loop (issue 23: the full-size prefill layer's FFN region).

A kernel that sums ``F`` tile products over a loop (``loop_sum``) is evaluated literally: one product per step.
The projection's traversal (:func:`verimirage.smt.ff.proj.project`) held every part it met, so contracting an
output it could not push through (``silu(A B) * (A C)``) kept all ``F`` steps' products alive; and the lazy
evaluation computed an accumulator chain's terms before summing any. At full size (512 x 14336 tiles, 128 steps)
that was ~14 GB a trial; now a step's product is freed once it is summed.
"""

from __future__ import annotations

import tracemalloc

import verimirage as vm
from verimirage.smt.verify import ff_test

M, K, N, F = 64, 512, 256, 128  # 128 steps of a (64, 4) x (4, 256) product: 128 KiB each, 16 MiB a part in all


def _pair() -> tuple[vm.Graph, vm.MuGraph]:
    t = K // F
    g = vm.Graph.parse(f"""graph {{
  %0 = input {{name='r0'}} : f16[{M},{K}]
  %1 = input {{name='r1'}} : f16[{K},{N}]
  %2 = matmul %0, %1 : f16[{M},{N}]
  %3 = silu %2 : f16[{M},{N}]
  %4 = input {{name='r2'}} : f16[{K},{N}]
  %5 = matmul %0, %4 : f16[{M},{N}]
  %6 = mul %3, %5 : f16[{M},{N}]
  return %6
}}""")
    mg = vm.MuGraph.parse(f"""mugraph {{
  %0 = input {{name='r0'}} : f16[{M},{K}]
  %1 = input {{name='r1'}} : f16[{K},{N}]
  %2 = input {{name='r2'}} : f16[{K},{N}]
  %3 = custom %0, %1, %2 {{frange={F}, grid=(2, 4)}} : f16[{M},{N}] {{
    %0 = input {{arg=0, fmap=1, imap=(0, None), shape=({M}, {K})}} : f16[{M // 2},{t}]
    %1 = input {{arg=1, fmap=0, imap=(None, 1), shape=({K}, {N})}} : f16[{t},{N // 4}]
    %2 = input {{arg=2, fmap=0, imap=(None, 1), shape=({K}, {N})}} : f16[{t},{N // 4}]
    %3 = matmul %0, %1 : f16[{M // 2},{N // 4}]
    %4 = loop_sum %3 : f16[{M // 2},{N // 4}]
    %5 = matmul %0, %2 : f16[{M // 2},{N // 4}]
    %6 = loop_sum %5 : f16[{M // 2},{N // 4}]
    %7 = fused %4, %6 : f16[{M // 2},{N // 4}] {{
      %0 = arg {{index=0}} : f16[{M // 2},{N // 4}]
      %1 = arg {{index=1}} : f16[{M // 2},{N // 4}]
      %2 = silu %0 : f16[{M // 2},{N // 4}]
      %3 = mul %2, %1 : f16[{M // 2},{N // 4}]
      return %3
    }}
    output %7 {{omap=(0, 1)}}
  }}
  return %3
}}""")
    return g, mg


def test_ff_loop_products_are_not_all_held() -> None:
    g, mg = _pair()
    tracemalloc.start()
    try:
        r = ff_test(g, mg, seed=0, trials=1)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert r.outcome.value == "proved", r.reason
    # inputs and their twins ~10 MiB; holding the steps' products was 28 MiB (traversal) to 77 MiB (and order)
    assert peak < 20 << 20, f"peak {peak / 2**20:.1f} MiB: the loop's per-step products are held at once"


def test_ff_loop_wrong_candidate_still_refuted() -> None:
    # the evaluation order changed, not what is computed: a candidate with the operands of the mul swapped
    # through silu (silu(A C) * (A B)) differs
    g, mg = _pair()
    bad = vm.MuGraph.parse(str(mg).replace("%1 = input {arg=1, fmap=0", "%1 = input {arg=9, fmap=0")
                           .replace("%2 = input {arg=2, fmap=0", "%2 = input {arg=1, fmap=0")
                           .replace("%1 = input {arg=9, fmap=0", "%1 = input {arg=2, fmap=0"))
    r = ff_test(g, bad, seed=0, trials=1)
    assert r.outcome.value == "refuted", r.reason


def test_exact_domains_sum_a_k_loop_as_one_product(monkeypatch) -> None:  # type: ignore[no-untyped-def]
    # the finite-field domains (fast and reference) evaluate loop_sum(A_k @ B_k) over a loop splitting the
    # contracted dim as A @ B over the whole dim (ir.interpret._folded_products): an identity of exact arithmetic,
    # so every output is the same as the literal per-step evaluation's (here on the suite's designs that fold)
    import numpy as np

    from verimirage.benchmarks.designs import expert, small_design_kw
    from verimirage.ir import interpret
    from verimirage.smt import ffref
    from verimirage.smt.ff.field import Field
    from verimirage.smt.ff.trials import _run_lazy, input_values
    from verimirage.smt.ff.values import stacked

    folded: list[int] = []
    real = interpret._folded_products
    fold = True

    def spy(*a):  # type: ignore[no-untyped-def]
        r = real(*a) if fold else {}
        folded.append(len(r))
        return r

    monkeypatch.setattr(interpret, "_folded_products", spy)
    for name in ("rmsnorm_linear", "lora", "gated_mlp"):
        g = vm.benchmarks.get(name, small=True)
        m = expert(name, g, **small_design_kw(name))
        fld, s = ffref.field_of(11), 11
        ins = ffref.trial_inputs(g, fld, s)
        ref, fast = [], []
        for fold in (True, False):
            before = sum(folded)
            ref.append(ffref.evaluate(m, ins, fld)[0])
            fast_fld = Field.from_seed(s)
            fast.append([stacked(o) for o in _run_lazy(m, input_values(g, fast_fld, s), fast_fld)])
            assert (sum(folded) > before) == fold, name  # the design has a K-loop the domains fold
        for a, b in zip(*ref, strict=True):
            assert np.array_equal(a, b), name
        for a, b in zip(*fast, strict=True):
            assert np.array_equal(a[0], b[0]), name
    # a float domain is not exact: its K-loop is summed step by step, as the kernel does
    fold, before = True, sum(folded) + len(folded)
    vm.evaluate(m, {t.name: np.ones(t.shape) for t in g.inputs})
    assert sum(folded) + len(folded) == before
