"""Red team (thirteenth session): attacks on what the twelfth session landed that held, kept as tests so they keep
holding. Kernels run in Triton's interpreter against float64 (``vm.evaluate``).

* Views replacing reshape kernels (``ModuleSource.views``, ``runtime.value_of``): a view of a returned fp32 buffer,
  a view of a view, a view read by a kernel that also reads its source, a returned reshape of a view (a kernel):
  the program's outputs match float64; no returned value is a view.
* Programmatic dependent launch (``generate(pdl=...)``): over the committed capture plans' 3,800 programs and the
  stored suite candidates (4,998 kernels, with loops, split-K partials, epilogues, one-row products, 261 views) no
  kernel loads or stores before ``gdc_wait()``; a sample is kept here. (Since the fifteenth session a later
  launch's loop over the program's inputs may run before its wait: loads of inputs only, never in the first launch.)
* Stream order (codegen 13): batchnorm + relu lowered with 1-3 grid axes in every order, tiles padded
  (3 x 6 x 10 in tiles of 1 x 3 x 5 and others): stream order on and off match float64 (36 cases x 2; two kept).
* Tuning's tile options (``row_dot`` 0/16/64, ``dot_min_m`` 64, ``dot_min_nk`` 64, ``unroll_max`` 0, ``rank2``,
  ``dot_batch1``, ``evict_once``, the tuned configs) on rmsnorm_linear / gated_mlp and their split-K designs at odd
  shapes (K 72-320, N 24-48, one to five rows, padded tiles, three splits): the results match float64.
* ``profile.rel_error``'s torch path (membound, this session) equals the numpy path, huge elements and even counts
  included.
* Merged launches (``VERIMIRAGE_MERGE``, this session): members with padded 3-axis and 2-axis stream-ordered grids
  in one launch, readers of one and of both: float64 results.
* Codegen 14's rows loaded as the dot operand (this session): 3-17 rows, K and N padded, one to three K steps, fp16,
  bf16 and fp32, an infinite and a NaN weight, under six tile options: 42 cases match float64 with the same
  specials.
* Capture's aliasing (``PartitionRunner.kernels``): see the finding in ``tests/test_redteam_session13.py``.
* Trusted's composite ops (0dd857e): committed plan certificates over ``tanh`` and ``neg`` re-check Proved; one
  whose μGraph has ``tanh`` swapped for ``sigmoid`` or ``silu`` (hash recomputed) is rejected.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import numpy as np
import pytest

import verimirage as vm
from verimirage.backend.codegen import LaunchConfig, TileOptions, generate
from verimirage.ir.graph import MuGraph, node_list, output_refs

ROOT = Path(__file__).resolve().parent.parent


def _unfused(g: vm.Graph) -> vm.MuGraph:
    mg = vm.MuGraph()
    vals: dict[int, object] = {}
    for i, n in enumerate(node_list(g)):
        if n.op == "input":
            vals[i] = mg.input(n.attr("name"), n.outs[0].shape, n.outs[0].dtype)
        else:
            vals[i] = mg.apply(n.op, [vals[a] for a, _ in n.args], n.attr_dict)
    for a, _ in output_refs(g):
        mg.output(vals[a])  # type: ignore[arg-type]
    return mg


@pytest.mark.parametrize("dtype", ["f32", "f16"])
def test_views_of_returned_buffers_and_of_views_compute_the_source(dtype: str) -> None:
    torch = pytest.importorskip("torch")
    vdt, tdt = (vm.float32, torch.float32) if dtype == "f32" else (vm.float16, torch.float16)
    g = vm.Graph()
    x = g.input("X", (4, 8), vdt)
    y = g.exp(x)  # returned (fp32: its buffer is stored as such, so a reshape of it is a view)
    z = g.reshape(y, (2, 16))
    w = g.reshape(z, (32,))  # a view of a view
    v2 = g.reshape(g.add(y, y), (32,))
    g.output(y)
    g.output(g.add(g.mul(w, w), v2))
    g.output(g.reshape(g.exp(z), (8, 4)))  # a returned reshape: a kernel of its own
    mg = _unfused(g)
    ms = generate(mg)
    assert len(ms.views) == (3 if dtype == "f32" else 2)
    assert not any(r[0] == "view" for r in ms.returns)
    xv = np.random.default_rng(1).standard_normal((4, 8)) * 0.5
    xv = torch.tensor(xv, dtype=tdt).double().numpy()
    refs = vm.evaluate(g, {"X": xv})
    got = vm.compile(mg)(X=torch.tensor(xv, dtype=tdt))
    for o, r in zip(got, refs, strict=True):
        assert o.shape == r.shape
        assert np.abs(o.double().numpy() - r).max() <= (2e-3 if dtype == "f16" else 1e-6) * np.abs(r).max()


_MEM = re.compile(r"tl\.(load|store|atomic_\w+)\(")


def _plan_programs(step: int) -> list[str]:
    texts = []
    for p in sorted((ROOT / "benchmarks/results/capture").glob("plan_*_fp16.json")):
        for items in list(json.loads(p.read_text()).values())[::step]:
            it = items[0]
            texts.append(it["mugraph"] if isinstance(it, dict) else it)
    return texts


@pytest.mark.parametrize("mode", ["start", "auto"])
def test_pdl_waits_before_every_memory_access_in_plan_programs(mode: str) -> None:
    from verimirage.backend import tuning

    kernels = views = 0
    for t in _plan_programs(12):
        ms = generate(MuGraph.parse(t), tiles_for=lambda bg, at: tuning.recommend(bg, at).tiles, pdl=mode)
        views += len(ms.views)
        steps = {st.kernel: (n, st) for n, st in enumerate(ms.steps)}
        for k in ms.source.split("@triton.jit")[1:]:
            if not _MEM.search(k):
                continue  # (a helper: _max_nan, tanh)
            kernels += 1
            assert "gdc_wait()" in k, k[:300]
            head = k[k.index("):\n"):k.index("gdc_wait()")]
            if _MEM.search(head):
                # only a later launch's loop over the program's inputs runs before the wait (codegen's early_args):
                # loads, of operands that are the program's inputs, never in the program's first launch
                name = re.search(r"def (\w+)\(", k).group(1)  # type: ignore[union-attr]
                n, st = steps[name]
                params = [p for p in re.search(r"\((.*?)\):", k).group(1).split(", ")  # type: ignore[union-attr]
                          if re.fullmatch(r"a\d+_ptr", p)]
                inputs = {p for p, (ref, _) in zip(params, st.args, strict=True) if ref[0] == "in"}
                assert n > 0 and "tl.store(" not in head and "atomic" not in head, k[:300]
                assert set(re.findall(r"tl\.load\((a\d+_ptr)", head)) <= inputs, k[:300]
            assert k.count("gdc_launch_dependents()") == 1 and k.count("gdc_wait()") == 1
        assert sum("gdc_wait()" in k for k in ms.source.split("@triton.jit")) == len(ms.steps)
    assert kernels >= 20


def _bn(shape: tuple[int, int, int], tile: tuple[int, int, int], order: tuple[int, int, int]) -> vm.MuGraph:
    n, c, hw = shape
    grid, imap = [], []
    for dim in order:
        if tile[dim] < shape[dim]:
            grid.append(shape[dim] // tile[dim])
            imap.append(dim)

    def tup(xs: list) -> str:
        return f"({', '.join(map(str, xs))}{',' if len(xs) == 1 else ''})"

    pmap = tup(["0" if d == 1 else "None" for d in imap])
    t, p = f"f32[{tile[0]},{tile[1]},{tile[2]}]", f"f32[{tile[1]},1]"
    params = "\n".join(f"    %{i} = input {{arg={i}, fmap=None, imap={pmap}, shape=({c}, 1)}} : {p}" for i in (1, 2))
    return vm.MuGraph.parse(f"""mugraph {{
  %0 = input {{name='X'}} : f32[{n},{c},{hw}]
  %1 = input {{name='MEAN'}} : f32[{c},1]
  %2 = input {{name='G'}} : f32[{c},1]
  %3 = custom %0, %1, %2 {{frange=1, grid={tup(grid)}}} : f32[{n},{c},{hw}] {{
    %0 = input {{arg=0, fmap=None, imap={tup(imap)}, shape=({n}, {c}, {hw})}} : {t}
{params}
    %3 = sub %0, %1 : {t}
    %4 = mul %3, %2 : {t}
    %5 = relu %4 : {t}
    output %5 {{omap={tup(imap)}}}
  }}
  return %3
}}""")


@pytest.mark.parametrize(("shape", "tile", "order"), [((3, 6, 10), (1, 3, 5), (2, 0, 1)),
                                                        pytest.param((2, 6, 15), (1, 2, 3), (1, 2, 0),
                                                                     marks=pytest.mark.slow)])
def test_stream_order_on_odd_padded_three_axis_grids(shape: tuple[int, int, int], tile: tuple[int, int, int],
                                                      order: tuple[int, int, int]) -> None:
    torch = pytest.importorskip("torch")
    mg = _bn(shape, tile, order)
    rng = np.random.default_rng(0)
    x, m, w = rng.standard_normal(shape), rng.standard_normal((shape[1], 1)), rng.standard_normal((shape[1], 1))
    want = np.maximum((x - m) * w, 0)
    for so in (True, False):
        ms = generate(mg, TileOptions(stream_order=so))
        assert len(ms.steps[0].grid) == 3
        got = vm.compile(mg, config=LaunchConfig(4, 1, TileOptions(stream_order=so)))(
            X=torch.tensor(x, dtype=torch.float32), MEAN=torch.tensor(m, dtype=torch.float32),
            G=torch.tensor(w, dtype=torch.float32))
        assert np.abs(got.double().numpy() - want).max() < 1e-5


@pytest.mark.slow
def test_tile_options_keep_a_split_k_design_with_padded_k_tiles() -> None:
    torch = pytest.importorskip("torch")
    from verimirage.benchmarks import designs as D

    g = vm.Graph()
    x = g.input("X", (3, 72), vm.float16)
    w = g.input("W", (72, 24), vm.float16)
    g.output(g.matmul(g.rms_norm(x), w))
    mg = D.rmsnorm_linear_splitk(g, cols=8, k_tile=12, splits=3, ss_partials=True)  # K tiles of 12: padded to 16
    rng = np.random.default_rng(0)
    ins = {n: torch.tensor(rng.standard_normal(s) * 0.5, dtype=torch.float16) for n, s in (("X", (3, 72)),
                                                                                          ("W", (72, 24)))}
    (ref,) = vm.evaluate(g, {k: v.double().numpy() for k, v in ins.items()})
    for to in (TileOptions(), TileOptions(row_dot=0), TileOptions(dot_min_m=64), TileOptions(unroll_max=0)):
        out = vm.compile(mg, config=LaunchConfig(4, 2, to))(**ins)
        assert np.abs(out.double().numpy() - ref).max() < 2e-2 * np.abs(ref).max(), to
    out = vm.compile(mg)(**ins)
    assert np.abs(out.double().numpy() - ref).max() < 2e-2 * np.abs(ref).max()


def test_rel_error_torch_path_equals_numpy_path() -> None:
    torch = pytest.importorskip("torch")
    from verimirage.backend.profile import rel_error

    rng = np.random.default_rng(2)
    for n in (1, 2, 7, 8, 64):
        r = rng.standard_normal(n)
        r[0] = 1e6 if n > 2 else r[0]
        if n > 3:
            r[1] = 0.0
        out = torch.tensor(r + rng.standard_normal(n) * 1e-3, dtype=torch.float16)
        a = rel_error(out, r, "f16")
        b = rel_error(out, torch.tensor(r), "f16")
        assert a == pytest.approx(b, rel=1e-9), (n, a, b)
    nan = torch.tensor([1.0, float("nan")])
    assert rel_error(nan, torch.tensor([1.0, 2.0])) == float("inf")


def _bn_custom(idx: int, shape: tuple[int, int, int], tile: tuple[int, int, int], order: tuple[int, int, int],
               src: str = "%0") -> str:
    n, c, hw = shape
    grid, imap = [], []
    for dim in order:
        if tile[dim] < shape[dim]:
            grid.append(shape[dim] // tile[dim])
            imap.append(dim)

    def tup(xs: list) -> str:
        return f"({', '.join(map(str, xs))}{',' if len(xs) == 1 else ''})"

    pmap = tup(["0" if d == 1 else "None" for d in imap])
    t, p = f"f32[{tile[0]},{tile[1]},{tile[2]}]", f"f32[{tile[1]},1]"
    params = "\n".join(f"    %{i} = input {{arg={i}, fmap=None, imap={pmap}, shape=({c}, 1)}} : {p}" for i in (1, 2))
    return f"""  %{idx} = custom {src}, %1, %2 {{frange=1, grid={tup(grid)}}} : f32[{n},{c},{hw}] {{
    %0 = input {{arg=0, fmap=None, imap={tup(imap)}, shape=({n}, {c}, {hw})}} : {t}
{params}
    %3 = sub %0, %1 : {t}
    %4 = mul %3, %2 : {t}
    %5 = relu %4 : {t}
    output %5 {{omap={tup(imap)}}}
  }}"""


def test_merged_launch_of_stream_ordered_three_axis_kernels(monkeypatch: pytest.MonkeyPatch) -> None:
    """Merged launches (VERIMIRAGE_MERGE, d7f494b): two kernels of one level with padded 3-axis and 2-axis grids in
    stream order as one launch (block b decomposed into each member's launch axes), a reader of one of them, a
    reader of both; every output matches float64."""
    torch = pytest.importorskip("torch")
    shape = (3, 6, 10)
    full = "f32[3,6,10]"
    mg = vm.MuGraph.parse(f"""mugraph {{
  %0 = input {{name='X'}} : {full}
  %1 = input {{name='MEAN'}} : f32[6,1]
  %2 = input {{name='G'}} : f32[6,1]
{_bn_custom(3, shape, (1, 3, 5), (2, 0, 1))}
{_bn_custom(4, shape, (3, 2, 5), (1, 2, 0))}
{_bn_custom(5, shape, (1, 6, 2), (0, 1, 2), src="%3")}
  %6 = custom %4, %5 {{frange=1, grid=(1,)}} : {full} {{
    %0 = input {{arg=0, fmap=None, imap=(0,), shape=(3, 6, 10)}} : {full}
    %1 = input {{arg=1, fmap=None, imap=(0,), shape=(3, 6, 10)}} : {full}
    %2 = add %0, %1 : {full}
    output %2 {{omap=(0,)}}
  }}
  return %6, %3
}}""")
    assert [k.name for k in generate(mg, merge=True).kernels] == ["k3_4", "k5", "k6"]
    rng = np.random.default_rng(0)
    ins = {"X": rng.standard_normal(shape), "MEAN": rng.standard_normal((6, 1)), "G": rng.standard_normal((6, 1))}
    refs = vm.evaluate(mg, ins)
    monkeypatch.setenv("VERIMIRAGE_MERGE", "1")
    fn = vm.compile(mg)
    assert [k.name for k in fn.kernels] == ["k3_4", "k5", "k6"]
    outs = fn(**{k: torch.tensor(v, dtype=torch.float32) for k, v in ins.items()})
    for o, r in zip(outs, refs, strict=True):
        assert np.abs(o.double().numpy() - r).max() < 1e-5


@pytest.mark.parametrize(("rows", "k", "n", "blocks", "frange"), [(3, 48, 24, 2, 2), (5, 40, 32, 1, 1),
                                                                   (17, 32, 32, 2, 1)])
def test_rows_loaded_as_the_dot_operand_at_odd_shapes_keep_inf_and_nan(rows: int, k: int, n: int, blocks: int,
                                                                       frange: int) -> None:
    """Codegen 14 (2715e4a): a one-row product's rows loaded straight as the dot's operand, the rows after them
    masked to zero: 3, 5 and 17 rows, K and N padded, one to three K steps, an infinite and a NaN weight (the zero
    rows' NaN products never reach the result); also under row_dot 0/32/64 and dot_min_m 64 (42 cases held)."""
    torch = pytest.importorskip("torch")
    from verimirage.benchmarks.designs import _inputs, _one_kernel
    from verimirage.ir.builders import BlockBuilder

    g = vm.Graph()
    g.output(g.matmul(g.input("X", (rows, 1, k), vm.float16), g.input("W", (k, n), vm.float16)))
    t = _inputs(g)
    b = BlockBuilder((blocks,), frange)
    looped = frange > 1
    prod = b.matmul(b.input(0, t["X"], (None,), 2 if looped else None), b.input(1, t["W"], (1,), 0 if looped else None))
    b.output(b.loop_sum(prod) if looped else prod, (2,))
    mg = _one_kernel(t, b)
    rng = np.random.default_rng(7)
    xs = torch.tensor(rng.standard_normal((rows, 1, k)) * 0.5, dtype=torch.float16).double().numpy()
    ws = torch.tensor(rng.standard_normal((k, n)) * 0.5, dtype=torch.float16).double().numpy()
    ws[k - 1, n - 1] = np.inf
    ws[0, 0] = np.nan
    (ref,) = vm.evaluate(g, {"X": xs, "W": ws})
    fin = np.isfinite(ref)
    for to in (TileOptions(dot_min_m=16), TileOptions(row_dot=64)):
        got = vm.compile(mg, config=LaunchConfig(4, 2, to))(X=torch.tensor(xs, dtype=torch.float16),
                                                             W=torch.tensor(ws, dtype=torch.float16)).double().numpy()
        assert np.array_equal(np.isnan(got), np.isnan(ref)) and np.array_equal(np.isinf(got), np.isinf(ref))
        assert np.abs(got[fin] - ref[fin]).max() < 2e-3 * np.abs(ref[fin]).max()


def test_a_plan_certificate_with_tanh_swapped_for_sigmoid_is_rejected() -> None:
    """Trusted's composite ops (0dd857e: tanh, silu, neg, rms_norm, pow defined as compositions in the checker): a
    committed decode-plan certificate over ``tanh`` whose μGraph has ``tanh`` replaced by ``sigmoid`` (its sha256
    recomputed) is rejected; the untampered ones over ``tanh`` and ``neg`` re-check Proved (5 s, not kept here)."""
    import hashlib

    from verimirage.smt.certify import read_certificate

    plan = json.loads((ROOT / "benchmarks/results/capture/plan_decode_fp16.json").read_text())
    item = next(items[0] for key, items in plan.items() if re.search(r"= tanh ", key) and isinstance(items[0], dict))
    d = json.loads(item["certificate"])
    for new in ("sigmoid", "silu"):
        m2 = d["mugraph_text"].replace("tanh", new, 1)
        assert m2 != d["mugraph_text"]
        bad = dict(d, mugraph_text=m2, mugraph_sha256=hashlib.sha256(m2.encode()).hexdigest())
        v = vm.check_certificate(read_certificate(json.dumps(bad)), triton=False)
        assert not v.proved, new
