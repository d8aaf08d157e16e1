"""Rule ablations and sweeps: a grid of (programs x rule variants x search options), one search each.

:func:`sweep` runs ``superoptimize`` on every cell of the grid (serially, or as Ray tasks with
``ray=True``) and returns a :class:`SweepTable`: per run the best candidate's cost estimate and kernel
count, the search time, the rules that fired and the rules the best candidate was derived with. The
table writes CSV (and Parquet when pyarrow is installed) and plots (matplotlib, when installed).
:func:`leave_one_theory_out` gives the built-in ablation's variants.

Every search runs with ``cache=False`` and the grid's seed, so a run's result does not depend on where it
ran: a Ray sweep and a serial sweep give the same table apart from the time column
(:meth:`SweepTable.same_results`).
"""

from __future__ import annotations

import csv
import logging
import time
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from ..ir.errors import GraphError
from ..ir.graph import Graph
from ..rewrite.rules import RuleError, Ruleset, builtin_rulesets

log = logging.getLogger(__name__)

#: the columns that must agree between two runs of one grid (everything but the wall times)
RESULT_COLUMNS = ("program", "variant", "options", "best_cost_us", "kernels", "verified", "rules_fired",
                  "rules_best", "error")


@dataclass(frozen=True)
class SweepRow:
    """One search of the grid."""

    program: str
    variant: str
    options: str
    best_cost_us: float  # the best candidate's cost estimate (inf: nothing verified)
    kernels: int  # its kernel launches (-1: nothing verified)
    verified: int
    search_s: float
    rules_fired: str  # "name:count;..." sorted by name
    rules_best: str  # the rules the best candidate was derived with, ";"-joined
    error: str = ""


@dataclass
class SweepTable:
    """The rows of a sweep, with writers and plots."""

    rows: list[SweepRow] = field(default_factory=list)
    wall_s: float = 0.0

    def results(self) -> list[tuple[Any, ...]]:
        """The rows without the time column (what two runs of one grid must agree on)."""
        return [tuple(getattr(r, c) for c in RESULT_COLUMNS) for r in self.rows]

    def same_results(self, other: SweepTable) -> bool:
        """Whether ``other`` has the same rows apart from the times."""
        return self.results() == other.results()

    def best(self, program: str, variant: str, options: str = "default") -> SweepRow:
        """The row of one cell (GraphError if the grid has none)."""
        for r in self.rows:
            if (r.program, r.variant, r.options) == (program, variant, options):
                return r
        raise GraphError(f"sweep table: no row for ({program!r}, {variant!r}, {options!r})")

    def write_csv(self, path: str | Path) -> Path:
        """Write the table as CSV; returns the path."""
        p = Path(path)
        p.parent.mkdir(parents=True, exist_ok=True)
        with p.open("w", newline="") as f:
            w = csv.DictWriter(f, fieldnames=list(SweepRow.__dataclass_fields__))
            w.writeheader()
            for r in self.rows:
                w.writerow(asdict(r))
        return p

    def write_parquet(self, path: str | Path) -> Path | None:
        """Write the table as Parquet if pyarrow is installed (None otherwise)."""
        try:
            import pyarrow as pa
            import pyarrow.parquet as pq
        except ImportError:
            log.info("sweep: pyarrow is not installed; no Parquet file written")
            return None
        p = Path(path)
        p.parent.mkdir(parents=True, exist_ok=True)
        cols = {c: [getattr(r, c) for r in self.rows] for c in SweepRow.__dataclass_fields__}
        pq.write_table(pa.table(cols), p)
        return p

    def plot(self, out_dir: str | Path) -> list[Path]:
        """Two PNG plots if matplotlib is installed: best cost per variant for each program
        (``best_cost.png``), and the cost of each variant relative to the first (``rule_impact.png``:
        which rules matter for which programs). Returns the files written ([] without matplotlib)."""
        try:
            import matplotlib

            matplotlib.use("Agg")
            import matplotlib.pyplot as plt
        except ImportError:
            log.info("sweep: matplotlib is not installed; no plots written")
            return []
        import math

        out = Path(out_dir)
        out.mkdir(parents=True, exist_ok=True)
        programs = list(dict.fromkeys(r.program for r in self.rows))
        variants = list(dict.fromkeys(f"{r.variant}|{r.options}" if r.options != "default" else r.variant
                                      for r in self.rows))

        def cost(p: str, v: str) -> float:
            for r in self.rows:
                label = f"{r.variant}|{r.options}" if r.options != "default" else r.variant
                if r.program == p and label == v:
                    return r.best_cost_us
            return math.nan

        files = []
        fig, ax = plt.subplots(figsize=(max(6, len(programs) * 1.2), 4))
        width = 0.8 / max(1, len(variants))
        for j, v in enumerate(variants):
            ys = [cost(p, v) for p in programs]
            ax.bar([i + j * width for i in range(len(programs))], [y if math.isfinite(y) else 0 for y in ys],
                   width, label=v)
        ax.set_xticks([i + 0.4 - width / 2 for i in range(len(programs))], programs, rotation=30, ha="right")
        ax.set_ylabel("best cost estimate (us)")
        ax.legend(fontsize="small")
        fig.tight_layout()
        files.append(out / "best_cost.png")
        fig.savefig(files[-1])
        plt.close(fig)

        fig, ax = plt.subplots(figsize=(max(6, len(variants) * 0.9), max(3, len(programs) * 0.5)))
        grid = [[cost(p, v) / cost(p, variants[0]) if cost(p, variants[0]) > 0 else math.nan for v in variants]
                for p in programs]
        im = ax.imshow(grid, aspect="auto", cmap="viridis")
        ax.set_xticks(range(len(variants)), variants, rotation=30, ha="right")
        ax.set_yticks(range(len(programs)), programs)
        fig.colorbar(im, ax=ax, label=f"best cost / best cost with {variants[0]}")
        fig.tight_layout()
        files.append(out / "rule_impact.png")
        fig.savefig(files[-1])
        plt.close(fig)
        return files

    def write(self, out_dir: str | Path, *, plots: bool = True) -> list[Path]:
        """CSV, Parquet (if pyarrow) and plots (if matplotlib) into ``out_dir``; the files written."""
        d = Path(out_dir)
        files = [self.write_csv(d / "sweep.csv")]
        pq = self.write_parquet(d / "sweep.parquet")
        if pq is not None:
            files.append(pq)
        if plots:
            files += self.plot(d)
        return files

    def __str__(self) -> str:
        lines = [f"{'program':<22} {'variant':<22} {'options':<12} {'cost us':>9} {'kern':>4} {'time s':>7}  rules"]
        for r in self.rows:
            lines.append(f"{r.program:<22} {r.variant:<22} {r.options:<12} {r.best_cost_us:>9.2f} {r.kernels:>4} "
                         f"{r.search_s:>7.2f}  {r.rules_best or '-'}{'  ERROR ' + r.error if r.error else ''}")
        return "\n".join(lines)


# --------------------------------------------------------------------------- the grid


Variant = Ruleset | str | Sequence[str | Ruleset] | Mapping[str, Any]


def leave_one_theory_out() -> dict[str, dict[str, Any]]:
    """The built-in ablation: every default rule (``"all"``), then each built-in theory disabled in turn."""
    out: dict[str, dict[str, Any]] = {"all": {}}
    for name in builtin_rulesets():
        out[f"-{name}"] = {"disable_rules": [name]}
    return out


def _variant_kwargs(v: Variant) -> tuple[str, dict[str, Any]]:
    """(label, superoptimize keywords) of a variant."""
    if isinstance(v, Ruleset):
        return v.name, {"rulesets": [v]}
    if isinstance(v, str):
        return f"-{v}", {"disable_rules": [v]}
    if isinstance(v, Mapping):
        return ",".join(f"{k}={_label(x)}" for k, x in sorted(v.items())) or "all", dict(v)
    if isinstance(v, Sequence):
        return "+".join(_label(x) for x in v), {"rulesets": list(v)}
    raise RuleError(f"sweep: variant {v!r}; expected a Ruleset, a rule/theory name to disable, a list of "
                    "rulesets, or a dict of superoptimize keywords")


def _label(x: Any) -> str:
    if isinstance(x, Ruleset):
        return x.name
    if isinstance(x, (list, tuple)):
        return "+".join(_label(y) for y in x)
    return str(x)


def _program(p: Any, small: bool, batch: int) -> tuple[str, Graph]:
    if isinstance(p, str):
        from ..benchmarks import get

        return p, get(p, batch=batch, small=small)
    if isinstance(p, tuple) and len(p) == 2 and isinstance(p[1], Graph):
        return str(p[0]), p[1]
    raise GraphError(f"sweep: program {p!r}; expected a suite name or a (name, vm.Graph) pair")


def _run_one(name: str, graph: Graph, variant: str, kwargs: dict[str, Any], opt_label: str,
             options: dict[str, Any]) -> SweepRow:
    """One search of the grid (a Ray task, or called in place)."""
    from ..logs import quiet_egglog
    from .superopt import superoptimize

    quiet_egglog()
    t0 = time.perf_counter()
    try:
        res = superoptimize(graph, **{**options, **kwargs, "cache": False, "progress": False})
    except (GraphError, RuleError) as e:
        return SweepRow(name, variant, opt_label, float("inf"), -1, 0, time.perf_counter() - t0, "", "",
                        str(e).splitlines()[0][:200])
    b = res.best
    fired = ";".join(f"{k}:{v}" for k, v in sorted(res.report.rules_fired.items()))
    return SweepRow(name, variant, opt_label, round(b.cost.time_s * 1e6, 6) if b else float("inf"),
                    b.num_kernels if b else -1, res.report.verified, round(res.report.total_seconds, 3), fired,
                    ";".join(b.rules) if b else "")


def sweep(
    programs: Sequence[str | tuple[str, Graph]],
    variants: Sequence[Variant] | Mapping[str, Variant] | None = None,
    options: Sequence[Mapping[str, Any]] | Mapping[str, Mapping[str, Any]] | None = None,
    *,
    small: bool = True,
    batch: int = 1,
    seed: int = 0,
    ray: bool = False,
    address: str | None = None,
    processes: int | None = None,
    out_dir: str | Path | None = None,
    plots: bool = True,
    progress: bool | None = None,
) -> SweepTable:
    """Run ``superoptimize`` over the grid ``programs x variants x options``.

    ``programs``: suite names (built at ``batch``, ``small`` shapes by default) or ``(name, vm.Graph)``
    pairs. ``variants`` (default: :func:`leave_one_theory_out`): a mapping label -> variant or a list of
    variants, each a :class:`Ruleset` (used alone), a list of rulesets/theory names (``rulesets=``), a rule
    or theory name (disabled), or a dict of ``superoptimize`` keywords. ``options``: search-option dicts
    (a mapping label -> dict, or a list labelled ``opt0``, ...; default one ``{}`` labelled ``default``);
    every search uses ``seed`` and no search cache. ``ray=True`` runs the searches as Ray tasks
    (``ray.init()`` locally, or ``address`` of a cluster); ``processes=N`` in a pool of N worker processes
    (0: one per core; for a many-core machine without Ray); the rows come back in grid order either way.
    ``out_dir``: write the table (:meth:`SweepTable.write`) there.
    """
    from .progress import Progress
    from .synth import Jobs

    t0 = time.perf_counter()
    vmap: dict[str, dict[str, Any]] = {}
    if variants is None:
        vmap = leave_one_theory_out()
    elif isinstance(variants, Mapping):
        vmap = {str(k): _variant_kwargs(v)[1] for k, v in variants.items()}
    else:
        for v in variants:
            label, kw = _variant_kwargs(v)
            vmap[label] = kw
    if options is None:
        omap: dict[str, dict[str, Any]] = {"default": {}}
    elif isinstance(options, Mapping):
        omap = {str(k): dict(v) for k, v in options.items()}
    else:
        omap = {f"opt{i}": dict(o) for i, o in enumerate(options)}
    for o in omap.values():
        bad = {"rulesets", "disable_rules", "cache", "progress", "seed"} & set(o)
        if bad:
            raise RuleError(f"sweep: options {sorted(bad)} are set by the sweep itself; put rule choices in variants")
    runner = Jobs(ray=ray, address=address, processes=processes)
    progs = [_program(p, small, batch) for p in programs]
    jobs = [(name, g, label, kw, olabel, {**o, "seed": seed})
            for name, g in progs for label, kw in vmap.items() for olabel, o in omap.items()]
    with Progress(progress, "sweep") as prog:
        prog.update(f"{len(jobs)} searches ({len(progs)} programs x {len(vmap)} variants x {len(omap)} options)"
                    + (" on Ray" if ray else f" in {runner.processes} processes" if runner.parallel else ""))
        if runner.parallel:
            with runner:
                rows = runner.map(_run_one, jobs)
        else:
            rows = []
            for k, j in enumerate(jobs):
                rows.append(_run_one(*j))
                prog.update(f"{j[0]} / {j[2]} / {j[4]}", completed=k + 1, total=len(jobs))
    table = SweepTable(list(rows), time.perf_counter() - t0)
    if out_dir is not None:
        for f in table.write(out_dir, plots=plots):
            log.info("sweep: wrote %s", f)
    return table


__all__ = ["RESULT_COLUMNS", "SweepRow", "SweepTable", "leave_one_theory_out", "sweep"]
