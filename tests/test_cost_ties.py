"""Cost ties go to fewer flops (issue 22, noticed): a rewrite that simplifies without moving fewer bytes
(``x*y + x*z -> x*(y+z)``: the same memory-bound estimate) lost the tie to the original form by graph order,
so the simplified term was never verified or returned."""

from __future__ import annotations

import verimirage as vm


def test_equal_estimates_prefer_the_simplified_term() -> None:
    g = vm.Graph()
    x, y, z = (g.input(n, (16, 64), vm.float16) for n in "xyz")
    g.output(g.add(g.mul(x, y), g.mul(x, z)))
    r = vm.superoptimize(g, cache=False, top_k=1, variants=0, time_budget_s=60)
    best = r.candidates[0]
    assert "mul-add-factor" in best.rules
    assert best.cost.other_flops == 2 * 16 * 64  # one mul and one add per element (was three ops)
