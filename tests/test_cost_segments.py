"""Short contiguous runs (issue 22, batchnorm_relu): tiles whose rows are narrower than a 128-byte DRAM segment are
charged by the cost model, and the partitioner offers segment-wide tiles of a contiguous dim whose finest block
counts would all give narrower rows (batchnorm_relu's 3136 columns: 32-wide fp16 tiles at most, 64-byte rows,
41.5 us on an H100 against Inductor's 36.0)."""

from __future__ import annotations

import verimirage as vm
from verimirage.ir.graph import node_list
from verimirage.rewrite import partition as P
from verimirage.rewrite.cost import H100, cost


def _rows(mg: vm.MuGraph) -> list[int]:
    """Contiguous bytes per row of each custom kernel's first input tile."""
    out = []
    for n in node_list(mg):
        if n.op == "custom":
            t = n.attr("block").nodes[0].outs[0]
            out.append(t.shape[-1] * t.dtype.itemsize)
    return out


def test_batchnorm_is_offered_and_ranks_segment_wide_tiles() -> None:
    g = P.normalise(vm.benchmarks.get_model("batchnorm_relu"))
    lows, _ = P.lower_all(g, cuts=False)
    fused = [lo for lo in lows if lo.mugraph.num_kernels == 1 and _rows(lo.mugraph)]
    assert any(r >= 128 for lo in fused for r in _rows(lo.mugraph))
    best = min(fused, key=lambda lo: cost(lo.mugraph))
    assert min(_rows(best.mugraph)) >= 128, best.mugraph
    narrow = [lo for lo in fused if _rows(lo.mugraph) == [64]]
    assert narrow and all(cost(lo.mugraph).time_s > cost(best.mugraph).time_s for lo in narrow)


def _ew(cols: int, rows_tile: int, n: int = 4096) -> vm.MuGraph:
    """relu of an (n, n) fp16 matrix in tiles of (rows_tile, cols); grid axis 0 walks the columns."""
    text = f"""mugraph {{
  %0 = input {{name='X'}} : f16[{n},{n}]
  %1 = custom %0 {{frange=1, grid=({n // cols}, {n // rows_tile})}} : f16[{n},{n}] {{
    %0 = input {{arg=0, fmap=None, imap=(1, 0), shape=({n}, {n})}} : f16[{rows_tile},{cols}]
    %1 = relu %0 : f16[{rows_tile},{cols}]
    output %1 {{omap=(1, 0)}}
  }}
  return %1
}}"""
    return vm.MuGraph.parse(text)


def test_short_rows_are_charged_unless_one_wave_of_neighbours_reads_them() -> None:
    wide, narrow = cost(_ew(64, 64)), cost(_ew(32, 128))  # same blocks, 128- vs 64-byte rows
    assert narrow.bytes > wide.bytes and narrow.time_s > wide.time_s
    # reads and writes both charged (128 / 64) ** segment_exponent
    assert abs(narrow.bytes - wide.bytes * 2 ** H100.segment_exponent) <= 2
    # one wave (<= 132 blocks) whose axis 0 walks the columns: consecutive blocks fill each other's segments
    one_wave = cost(_ew(32, 4096, 4096))
    assert one_wave.kernels[0].blocks <= H100.sms
    assert one_wave.bytes == 2 * 4096 * 4096 * 2
