"""The program-wide C launcher of the lean path (``verimirage.backend.launch``), on the CPU: the parameter values
it would pass per kernel (``params``), the plans it refuses, and the kernels it leaves to Triton's launcher. Its
launches themselves run on the GPU (``tests/test_eager_path.py::test_lean_path_on_the_gpu``)."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import pytest

from verimirage.backend import launch

pytestmark = pytest.mark.skipif(launch.module() is None, reason="no C compiler for the launcher here")


def _kernel(signature: dict[str, str], *, scratch: int = 0, pdl: bool = False, ctas: int = 1) -> Any:
    run = SimpleNamespace(global_scratch_size=scratch, profile_scratch_size=0, launch_cooperative_grid=False,
                          launch_pdl=pdl)
    return SimpleNamespace(run=run, metadata=SimpleNamespace(num_ctas=ctas), packed_metadata=(4, ctas, 2048),
                           src=SimpleNamespace(signature=signature), function=77)


class _T:
    """Stands in for a tensor argument (kernel_entry only tells tensors from integers)."""


def test_entry_drops_specialised_integers_and_fills_pointer_slots() -> None:
    sig = {"a": "*fp16", "a_s0": "i32", "a_s1": "constexpr", "o": "*fp32", "o_s0": "i64", "o_s1": "constexpr"}
    call = [_T(), 64, 1, _T(), -5, 1]
    entry = launch.kernel_entry(_kernel(sig), call, (3, 2, 1), [(0, 0), None, None, (2, 256), None, None])
    fn, gx, gy, gz, block, shared, values, slots, sizes = entry
    assert (fn, gx, gy, gz, block, shared) == (77, 3, 2, 1, 128, 2048)
    assert sizes == [8, 4, 8, 8, 8, 8]  # pointer, i32, pointer, i64, then Triton's two scratch pointers
    assert values == [0, 64, 0, (-5) & 0xFFFFFFFFFFFFFFFF, 0, 0]  # pointer slots hold 0 until a call fills them
    assert slots == [(0, 0, 0), (2, 2, 256)]
    plan = launch.make_plan(0, 3, [entry], check=False)
    got = launch.module().params(plan, 0, 1000, 2000, 3000)
    assert got == [[1000, 64, 3256, (-5) & 0xFFFFFFFFFFFFFFFF, 0, 0]]


def test_plans_of_several_kernels_and_wrong_calls() -> None:
    a = launch.kernel_entry(_kernel({"x": "*fp16", "y": "*fp16"}), [_T(), _T()], (1, 1, 1), [(0, 0), (1, 0)])
    b = launch.kernel_entry(_kernel({"y": "*fp16", "n": "i32"}), [_T(), 7], (4, 1, 1), [(1, 16), None])
    plan = launch.make_plan(0, 2, [a, b], check=False)
    assert launch.module().params(plan, 5, 10, 20) == [[10, 20, 0, 0], [36, 7, 0, 0]]
    with pytest.raises(TypeError, match="1 pointers; this plan takes 2"):
        launch.module().params(plan, 5, 10)
    with pytest.raises(TypeError):
        launch.module().params(plan, 5, 10, "x")
    with pytest.raises(ValueError, match="slot 0 out of range"):
        launch.make_plan(0, 1, [b], check=False)  # its pointer comes from source 1 of a one-pointer plan


@pytest.mark.parametrize(("kern", "why"), [
    (_kernel({"p": "*fp16"}, scratch=64), "scratch"),
    (_kernel({"p": "*fp16"}, pdl=True), "programmatic"),
    (_kernel({"p": "*fp16"}, ctas=2), "CTAs per cluster"),
    (_kernel({"p": "*fp16", "s": "fp32"}), "argument type 'fp32'"),
])
def test_kernels_left_to_triton(kern: Any, why: str) -> None:
    call = [_T()] + [0.5] * (len(kern.src.signature) - 1)
    with pytest.raises(ValueError, match=why):
        launch.kernel_entry(kern, call, (1, 1, 1), [(0, 0)] + [None] * (len(call) - 1))


def test_signature_must_match_the_arguments() -> None:
    with pytest.raises(ValueError, match="2 signature entries for 1 arguments"):
        launch.kernel_entry(_kernel({"p": "*fp16", "q": "*fp16"}), [_T()], (1, 1, 1), [(0, 0)])
