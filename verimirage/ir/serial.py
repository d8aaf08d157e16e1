"""JSON form of programs (round-trips with :func:`to_json` / :func:`from_json`)."""

from __future__ import annotations

import json
from typing import Any

from .dtypes import DType
from .errors import GraphError
from .graph import BlockGraph, Graph, MuGraph, Node, OutputMap, ThreadGraph, make_attrs, node_list, output_refs
from .ops import TensorType

SCHEMA = "verimirage.program/1"


def _enc_value(v: Any) -> Any:
    if isinstance(v, BlockGraph):
        return {
            "block": {
                "grid": list(v.grid),
                "frange": v.frange,
                "nodes": [_enc_node(n) for n in v.nodes],
                "outputs": [list(r) for r in v.outputs],
                "omaps": [list(o.dims) for o in v.omaps],
                **({} if v.flimit is None else {"flimit": list(v.flimit)}),
            }
        }
    if isinstance(v, ThreadGraph):
        return {"thread": {"nodes": [_enc_node(n) for n in v.nodes], "outputs": [list(r) for r in v.outputs]}}
    if isinstance(v, tuple):
        return {"tuple": [_enc_value(x) for x in v]}
    if isinstance(v, float):
        return {"float": repr(v)}
    return v


def _dec_value(v: Any) -> Any:
    if isinstance(v, dict):
        if "block" in v:
            b = v["block"]
            return BlockGraph(
                tuple(b["grid"]),
                b["frange"],
                tuple(_dec_node(n) for n in b["nodes"]),
                tuple((int(a), int(k)) for a, k in b["outputs"]),
                tuple(OutputMap(tuple(o)) for o in b["omaps"]),
                tuple(b["flimit"]) if "flimit" in b else None,
            )
        if "thread" in v:
            t = v["thread"]
            return ThreadGraph(
                tuple(_dec_node(n) for n in t["nodes"]), tuple((int(a), int(k)) for a, k in t["outputs"])
            )
        if "tuple" in v:
            return tuple(_dec_value(x) for x in v["tuple"])
        if "float" in v:
            return float(v["float"])
        raise GraphError(f"from_json: unknown attribute value {v!r}")
    return v


def _enc_node(n: Node) -> dict[str, Any]:
    return {
        "op": n.op,
        "args": [list(r) for r in n.args],
        "attrs": {k: _enc_value(v) for k, v in n.attrs},
        "outs": [{"shape": list(t.shape), "dtype": t.dtype.short} for t in n.outs],
    }


def _dec_node(d: dict[str, Any]) -> Node:
    return Node(
        d["op"],
        tuple((int(a), int(k)) for a, k in d["args"]),
        make_attrs({k: _dec_value(v) for k, v in d["attrs"].items()}),
        tuple(TensorType(tuple(int(s) for s in t["shape"]), DType.parse(t["dtype"])) for t in d["outs"]),
    )


def to_dict(g: Graph) -> dict[str, Any]:
    """Plain-data form of a kernel graph or μGraph."""
    return {
        "schema": SCHEMA,
        "kind": "mugraph" if isinstance(g, MuGraph) else "graph",
        "nodes": [_enc_node(n) for n in node_list(g)],
        "outputs": [list(r) for r in output_refs(g)],
    }


def to_json(g: Graph) -> str:
    """JSON text of a kernel graph or μGraph."""
    return json.dumps(to_dict(g), sort_keys=True)


def from_dict(d: Any) -> Graph:
    """Inverse of :func:`to_dict`; the result is checked."""
    if not isinstance(d, dict) or d.get("schema") != SCHEMA:
        got = d.get("schema") if isinstance(d, dict) else type(d).__name__
        raise GraphError(f"from_json: schema {got!r}; expected {SCHEMA!r}")
    try:
        nodes = [_dec_node(n) for n in d["nodes"]]
        outs = [(int(a), int(k)) for a, k in d["outputs"]]
    except GraphError:
        raise
    except (KeyError, TypeError, ValueError, IndexError, AttributeError, OverflowError, RecursionError) as e:
        raise GraphError(f"from_json: malformed program ({type(e).__name__}: {str(e)[:200]})") from None
    cls = MuGraph if d.get("kind") == "mugraph" else Graph
    g = cls._from_parts(nodes, outs)
    try:
        g.check()
    except GraphError:
        raise
    except (TypeError, ValueError, KeyError, IndexError, AttributeError, OverflowError, RecursionError) as e:
        raise GraphError(f"from_json: malformed program ({type(e).__name__}: {str(e)[:200]})") from None
    return g


def from_json(s: str) -> Graph:
    """Read a program from JSON text."""
    try:
        d = json.loads(s)
    except (TypeError, json.JSONDecodeError, RecursionError) as e:
        raise GraphError(f"from_json: not JSON, or nested too deeply ({str(e)[:200]})") from None
    return from_dict(d)
