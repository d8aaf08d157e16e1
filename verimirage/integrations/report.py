"""What the capture took and why not the rest: :class:`Report` (returned by ``vm.explain``)."""

from __future__ import annotations

from collections import Counter
from dataclasses import asdict, dataclass, field
from typing import Any


@dataclass
class PartitionReport:
    """One partition of an ATen graph: its ops, whether verimirage took it, and why not if it did not."""

    graph: int
    index: int
    kind: str
    ops: list[str]
    taken: bool = False
    reason: str | None = None
    kernels: list[str] = field(default_factory=list)
    estimated_us: float | None = None
    measured_us: float | None = None
    fallback_us: float | None = None
    search_s: float | None = None
    #: how the search split the partition into regions (``SearchReport.split`` and one line per region;
    #: empty when it was searched whole)
    split: str = ""
    regions: list[str] = field(default_factory=list)
    #: with ``profile``: the measured µs of each verified candidate timed (the search's best first; None for one
    #: that failed to compile, launch or check); ``measured_us`` is the fastest
    candidates_us: list[float | None] = field(default_factory=list)

    @property
    def name(self) -> str:
        """``<graph kind><graph index>.p<partition index>``."""
        return f"{self.kind}{self.graph}.p{self.index}"


@dataclass
class OpRecord:
    """One ATen tensor op of a captured graph: where it runs and, if not in verimirage, why."""

    graph: int
    op: str
    node: str
    compute: bool
    partition: int | None
    reason: str | None
    detail: str | None


#: what :meth:`Report.summary` says when the backend was never called
NO_GRAPH = ("no ATen graph reached verimirage: Dynamo ran the code eagerly (a graph break it cannot resume from, "
            "e.g. inside a loop; TORCH_LOGS=graph_breaks says which)")


@dataclass
class Report:
    """What verimirage took from the ATen graphs of a model.

    ``partitions``: every partition lifted into a ``vm.Graph`` (taken or not, with the reason).
    ``ops``: every ATen tensor op of every graph. ``coverage``: the fraction of compute ops (tensor ops
    that are not views, aliases or tuple accesses) that run in verimirage kernels; ``coverage_all``
    counts the views too. ``left``: the ops left to the fallback, each with its reason.
    """

    graphs: list[str] = field(default_factory=list)
    partitions: list[PartitionReport] = field(default_factory=list)
    ops: list[OpRecord] = field(default_factory=list)
    #: graph-level decisions (a captured graph given back to the fallback whole, and why)
    notes: list[str] = field(default_factory=list)
    #: with ``profile``: per captured graph, its time and the fallback's time for the whole graph (µs)
    graph_times: list[dict[str, Any]] = field(default_factory=list)

    # -- building
    def new_graph(self, kind: str) -> int:
        """Register a captured graph (``forward``, ``backward`` or ``inference``); its index."""
        self.graphs.append(kind)
        return len(self.graphs) - 1

    def new_partition(self, graph: int, ops: list[str]) -> PartitionReport:
        """A partition record of graph ``graph`` (not yet registered: see :meth:`add_partition`)."""
        return PartitionReport(graph, len(self.partitions), self.graphs[graph], ops)

    def add_partition(self, p: PartitionReport) -> int:
        """Register partition record ``p``; its index."""
        p.index = len(self.partitions)
        self.partitions.append(p)
        return p.index

    # -- reading
    def _taken(self, r: OpRecord) -> bool:
        return r.partition is not None and self.partitions[r.partition].taken

    def reason_of(self, r: OpRecord) -> str | None:
        """Why op ``r`` is left to the fallback (None when verimirage runs it)."""
        if self._taken(r):
            return None
        if r.partition is not None:
            return self.partitions[r.partition].reason or "not taken"
        return r.reason or "not taken"

    @property
    def left(self) -> list[OpRecord]:
        """The compute ops left to the fallback (``reason_of`` says why)."""
        return [r for r in self.ops if r.compute and not self._taken(r)]

    def _cov(self, recs: list[OpRecord]) -> float:
        return sum(self._taken(r) for r in recs) / len(recs) if recs else 1.0

    @property
    def coverage(self) -> float:
        """Fraction of the ATen compute ops that run in verimirage kernels (1.0 for a graph with none)."""
        return self._cov([r for r in self.ops if r.compute])

    @property
    def coverage_all(self) -> float:
        """Fraction of all ATen tensor ops (views included) inside taken partitions."""
        return self._cov(self.ops)

    @property
    def counts(self) -> tuple[int, int]:
        """(compute ops taken, compute ops)."""
        comp = [r for r in self.ops if r.compute]
        return sum(self._taken(r) for r in comp), len(comp)

    def summary(self, graph: int | None = None) -> str:
        """One line: coverage, partitions taken, and the reasons for what was left (or that no graph was captured:
        Dynamo ran the module eagerly, e.g. after a graph break inside a loop)."""
        if not self.graphs:
            return NO_GRAPH
        recs = [r for r in self.ops if graph is None or r.graph == graph]
        comp = [r for r in recs if r.compute]
        taken = sum(self._taken(r) for r in comp)
        parts = [p for p in self.partitions if graph is None or p.graph == graph]
        why = Counter(f"{r.op}: {(self.reason_of(r) or '').split(':')[0]}" for r in comp if not self._taken(r))
        left = ", ".join(f"{k} x{v}" if v > 1 else k for k, v in why.most_common(8))
        return (f"{taken}/{len(comp)} compute ops in verimirage kernels, {sum(p.taken for p in parts)}/{len(parts)} "
                f"partitions taken" + (f"; left: {left}" if left else ""))

    def to_dict(self) -> dict[str, Any]:
        """The report as plain data."""
        return {
            "coverage": self.coverage,
            "coverage_all": self.coverage_all,
            "graphs": list(self.graphs),
            "partitions": [asdict(p) | {"name": p.name} for p in self.partitions],
            "left": [asdict(r) | {"reason": self.reason_of(r)} for r in self.left],
            "notes": list(self.notes),
            "graph_times": [dict(t) for t in self.graph_times],
        }

    def table(self) -> Any:
        """A rich Table: partitions, then the ops left behind with their reasons."""
        from rich.table import Table

        t = Table(title=f"verimirage: {100 * self.coverage:.0f}% of ATen compute ops in verimirage kernels "
                        f"({self.counts[0]}/{self.counts[1]})")
        for col in ("where", "ops", "taken", "kernels", "est. us", "meas. us", "reason"):
            t.add_column(col)
        for p in self.partitions:
            kernels = str(len(p.kernels)) + (f" ({len(p.regions)} regions)" if p.regions else "")
            t.add_row(p.name, " ".join(p.ops), "yes" if p.taken else "no", kernels,
                      "" if p.estimated_us is None else f"{p.estimated_us:.1f}",
                      "" if p.measured_us is None else f"{p.measured_us:.1f}" + (
                          f" (best of {len(p.candidates_us)})" if len(p.candidates_us) > 1 else ""), p.reason or "")
        for r in self.ops:
            if r.partition is None and r.compute:
                t.add_row(f"{self.graphs[r.graph]}{r.graph}:{r.node}", r.op, "no", "", "", "",
                          f"{r.reason}: {r.detail}" if r.detail else str(r.reason))
        return t

    def __str__(self) -> str:
        import io

        from rich.console import Console

        con = Console(width=160, record=True, file=io.StringIO())
        con.print(self.table())
        if not self.graphs:
            con.print(NO_GRAPH)
        for n in self.notes:
            con.print(n)
        return con.export_text()
