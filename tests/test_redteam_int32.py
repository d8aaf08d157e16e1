"""Red-team finding (high on a GPU, silently wrong values or memory read and written out of bounds): the generated
kernels compute element offsets in int32 (``tl.program_id`` and the strides, passed as ``i32``: ``pid0 * 1 *
a0_s0``), while shapes of up to 2**34 elements are accepted (``ir.limits.MAX_ELEMENTS``). A tensor of 2**31 or more
elements (an fp16 ``(65536, 65536)``; a prefill's logits, 32 x 4096 x 32000) wrapped past 2**31 and the kernels
addressed other memory; so did an input *view* whose elements lie more than 2**31 apart (a slice of such a tensor),
since the runtime passes its strides as they are. Inductor indexes in int64 past that size; here the code generator
refuses such a tensor (a GraphError: ``vm.compile`` says why, the capture leaves the partition to the fallback) and
the runtime copies such a view to a contiguous tensor first. Indexing in int64 where needed would lift the limit.
(The GPU run is the coordinator's: ``pytest -m gpu tests/test_redteam_int32.py``, 8 GiB of GPU memory.)
"""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pytest

import verimirage as vm
from verimirage.backend import runtime
from verimirage.backend.codegen import INT32_INDEX, generate


def _exp(shape: tuple[int, ...], dt: vm.DType = vm.float16) -> vm.Graph:
    g = vm.Graph()
    x = g.input("X", shape, dt)
    g.output(g.exp(x))
    return g


def test_tensor_past_int32_offsets_was_indexed_in_int32() -> None:
    for shape in [(65536, 32768), (2**31,), (2, 2**30)]:
        with pytest.raises(vm.GraphError, match="int32"):
            generate(vm.MuGraph.from_graph(_exp(shape)))
    # an intermediate value past the limit (the program's inputs and outputs below it) is refused too
    g = vm.Graph()
    a, b = g.input("A", (65536, 1), vm.float16), g.input("B", (1, 65536), vm.float16)
    g.output(g.sum(g.exp(g.add(a, b)), 1))
    with pytest.raises(vm.GraphError, match="int32"):
        generate(vm.MuGraph.from_graph(g))
    src = generate(vm.MuGraph.from_graph(_exp((65536, 32767)))).source  # (just below: as before)
    assert "a0_s0" in src


def test_input_view_spanning_past_int32_was_read_with_its_strides(monkeypatch: pytest.MonkeyPatch) -> None:
    torch = pytest.importorskip("torch")
    assert runtime._element_span(SimpleNamespace(shape=(65536, 16), stride=lambda: (65536, 1),
                                                 numel=lambda: 2**20)) == 65535 * 65536 + 16
    assert runtime._element_span(SimpleNamespace(shape=(4, 8), stride=lambda: (0, 1), numel=lambda: 32)) == 8
    monkeypatch.setattr(runtime, "INT32_INDEX", 64)  # (a real view past 2**31 elements needs 4 GiB of memory)
    prog = vm.compile(_exp((8, 4), vm.float32))
    base = torch.randn(8, 64, generator=torch.Generator().manual_seed(0))
    view = base[:, 10:14]  # elements 7 * 64 + 4 apart: past the (patched) limit
    (x,) = prog._bind((view,), {})
    assert x.is_contiguous() and torch.equal(x, view)
    (y,) = prog._bind((base[:1, :4].expand(8, 4),), {})  # (a broadcast view spans 4 elements: passed as it is)
    assert y.stride() == (0, 1)
    np.testing.assert_allclose(prog(view).numpy(), np.exp(view.double().numpy()), rtol=1e-6)


@pytest.mark.gpu
def test_tensor_past_int32_offsets_on_a_gpu() -> None:
    torch = pytest.importorskip("torch")
    with pytest.raises(vm.GraphError, match="int32"):
        vm.compile(_exp((65536, 32768)))
    big = torch.randn(65536, 32769, dtype=torch.float16, device="cuda")  # 2**31 + 65536 elements
    view = big[:, :8]  # its last element is 65535 * 32769 + 7 > 2**31 elements past its first
    assert runtime._element_span(view) >= INT32_INDEX
    prog = vm.compile(_exp((65536, 8)))
    torch.testing.assert_close(prog(view), view.float().exp().half())
