"""The orchestrator: ``vm.superoptimize`` and its phases, search options, admitting rules, the float-safety
check, the on-disk search cache, rule sweeps and rule synthesis.

It sits above :mod:`verimirage.rewrite` (e-graph, rules, lowering into μGraphs, cost model),
:mod:`verimirage.smt` (verification, certificates) and :mod:`verimirage.backend` (Triton), and drives them;
those packages do not import it.
"""
