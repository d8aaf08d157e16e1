"""How this backend launches a program, as the cost model asks it (:class:`TritonLaunches`, :data:`LAUNCHES`).

The cost model (:mod:`verimirage.rewrite.cost`) prices a μGraph from its block graphs; a few of its questions only
the code generator can answer: whether an elementwise kernel is emitted flat and how many elements a flat block
takes, the block graph a kernel-level op runs as, the least shared memory a kernel can be launched with, how
many launches the merged mode makes of a program, the deepest one-row product lowered to a ``tl.dot``, and the
pipeline stages and warps a looped kernel gets. :class:`TritonLaunches` answers them from this package's own
rules (:mod:`.tuning`, :mod:`.resources`, :mod:`.wrap`, :mod:`.codegen`, :mod:`.runtime`). It satisfies the
cost model's ``LaunchModel`` protocol by its shape alone: this package does not import the cost model, and the
orchestrator (:mod:`verimirage.pipeline.pricing`) joins the two.
"""

from __future__ import annotations

import functools
from collections.abc import Sequence

from ..ir.graph import BlockGraph, Graph, Node, node_list
from ..ir.ops import TensorType
from .codegen import CHUNKED_SUM_K, ROW_DOT_MAX_K, _as_mugraph, _launch_units, arg_storage
from .resources import min_smem
from .runtime import _merge_wanted
from .tuning import FLAT_BLOCK, SMEM_BUDGET, flat_pays, merge_fits, recommend
from .wrap import default_block, to_kernels


class TritonLaunches:
    """The Triton backend's answers to the cost model's launch questions (stateless; use :data:`LAUNCHES`)."""

    #: elements a block of an elementwise kernel emitted flat takes (``tuning.FLAT_BLOCK``)
    flat_block: int = FLAT_BLOCK

    def flat_pays(self, bg: BlockGraph, in_types: Sequence[TensorType]) -> bool:
        """Whether kernel ``bg`` is emitted flat, one index range over its outputs' elements
        (:func:`.tuning.flat_pays`, as :func:`.tuning.recommend` decides)."""
        return flat_pays(bg, in_types)

    def min_smem(self, bg: BlockGraph, in_types: Sequence[TensorType], limit: int) -> int:
        """The least shared memory ``bg`` can be launched with under any configuration (:func:`.resources.min_smem`:
        a cheap bound instead where that bound is within ``limit``)."""
        return min_smem(bg, in_types, limit)

    def default_block(self, node: Node, in_types: Sequence[TensorType]) -> BlockGraph:
        """The block graph kernel-level ``node`` runs as outside a custom kernel (:func:`.wrap.default_block`)."""
        return default_block(node, in_types)

    def merged_launches(self, g: Graph) -> int:
        """How many launches the merged mode (``VERIMIRAGE_MERGE``, :func:`.codegen.generate`'s ``merge``) makes of
        ``g``'s kernels: one per dependency level and warps count (:func:`.tuning.recommend`'s), split where their
        shared memory together would lower the launch's stages (:func:`.tuning.merge_fits`), kernel-level ops
        wrapped as :func:`.wrap.to_kernels` wraps them. Raises where an op cannot be wrapped."""
        km = to_kernels(_as_mugraph(g))
        nodes = node_list(km)
        store = arg_storage(km)

        def fits(ids: Sequence[int]) -> bool:
            return merge_fits([(nodes[j].attr("block"), [nodes[a].outs[k] for a, k in nodes[j].args], store[j])
                               for j in ids])

        return len(_launch_units(nodes, set(), True, lambda bg, at: recommend(bg, at).num_warps, fits))

    def merge_wanted(self) -> bool:
        """Whether the runtime runs programs with merged launches when not told (``VERIMIRAGE_MERGE``)."""
        return _merge_wanted()

    #: the deepest one-row product codegen lowers to a 16-row ``tl.dot`` (``codegen.ROW_DOT_MAX_K``)
    row_dot_max_k: int = ROW_DOT_MAX_K
    #: the chunk depth of a sum of whole rows before a loop (``codegen.CHUNKED_SUM_K``: ``chunked_sums``)
    chunked_sum_k: int = CHUNKED_SUM_K

    def loop_stages(self, stage_bytes: int) -> int:
        """The pipeline stages :func:`.tuning.recommend` gives a ``tl.dot`` loop (no chained products) whose one
        iteration loads ``stage_bytes`` of 16-row tiles: four where four stages fit in four fifths of
        ``tuning.SMEM_BUDGET``, three where three stages' two buffers fit in it (the count of
        :func:`.resources.smem_estimate`), else two (recommend's few-block and side-use rules left out)."""
        return 4 if 4 * stage_bytes <= SMEM_BUDGET * 4 // 5 else 3 if 2 * stage_bytes <= SMEM_BUDGET else 2

    def loop_warps(self, largest_tile: int, dots: bool) -> int:
        """The warps :func:`.tuning.recommend` gives a kernel: 4 with ``tl.dot``; without, 8 for a largest tile of
        4,096 elements or more, else 4 (its 16 warps for tiles of 32,768 left out, as the cost model was fitted)."""
        return 4 if dots or largest_tile < 4096 else 8

    def dot_launch(self, bg: BlockGraph, in_types: Sequence[TensorType]) -> tuple[int, int]:
        """The rows :func:`.tuning.recommend` pads ``bg``'s ``tl.dot`` row operands to (``TileOptions.dot_min_m``:
        16 for mma.sync at a product's own rows, 64 for wgmma) and the warps it gives ``bg``."""
        return _dot_launch(bg, tuple(in_types))


@functools.lru_cache(maxsize=4096)
def _dot_launch(bg: BlockGraph, in_types: tuple[TensorType, ...]) -> tuple[int, int]:
    c = recommend(bg, in_types)
    return c.tiles.dot_min_m, c.num_warps


#: The backend's launch model, which the orchestrator passes to the cost model.
LAUNCHES = TritonLaunches()

__all__ = ["LAUNCHES", "TritonLaunches"]
