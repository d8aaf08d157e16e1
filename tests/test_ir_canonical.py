"""The checker's reader of canonical program text (``ir.text.read_program``): it reads every program as the parser
does, and reads nothing else (twenty-first session: the parser of hand-written text left the trusted path)."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

import verimirage as vm
from verimirage.ir.graph import node_list, output_refs
from verimirage.ir.text import read_program

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(Path(__file__).parent / "cases"))
from corpus import CASES  # noqa: E402


def _texts() -> list[tuple[str, bool]]:
    """Every program text of the committed certificates (sub-certificates too) and of the mutation corpus."""
    out: list[tuple[str, bool]] = []

    def walk(d: object) -> None:
        if isinstance(d, dict):
            out.extend((v, k == "mugraph_text") for k, v in d.items() if k in ("graph_text", "mugraph_text"))
            for v in d.values():
                walk(v)
        elif isinstance(d, list):
            for v in d:
                walk(v)

    for f in [*ROOT.glob("proofs/*.json"), *ROOT.glob("benchmarks/candidates/*/proofs/*.json")]:
        walk(json.loads(f.read_text()))
    for c in CASES:
        for make in (c.a, c.b):
            g = make()
            out.append((str(g), isinstance(g, vm.MuGraph)))
    return out


def test_the_canonical_reader_reads_every_program_as_the_parser_does() -> None:
    texts = _texts()
    assert len(texts) > 500
    for text, mu in texts:
        g, want = read_program(text, mu), (vm.MuGraph if mu else vm.Graph).parse(text)
        assert type(g) is type(want) and node_list(g) == node_list(want) and output_refs(g) == output_refs(want)


def _lora() -> str:
    return str(json.loads((ROOT / "proofs" / "lora_bs1.json").read_text())["mugraph_text"])


@pytest.mark.parametrize("edit", [
    lambda t: t.replace("\n", "\n# a comment\n", 1),  # (the parser of hand-written text reads these)
    lambda t: t.replace("\n", "\n\n", 1),
    lambda t: t.replace(" = ", " =  ", 1),
    lambda t: t.replace("\n", "\r\n"),
    lambda t: t.replace("f16[", "float16[", 1),
    lambda t: t.replace("omap=(1,)", "omap=[1]", 1),
    lambda t: t + "\n",
    lambda t: t.replace("mugraph {", "graph {", 1),
    lambda t: t.replace("%0 = input {name=", "%0 = input {name=1, name=", 1),
    lambda t: t.replace("{frange=", "{extra=1, frange=", 1),
    lambda t: t.replace("{frange=", "{", 1),
    lambda t: t.replace(" : f16[", " : f16[1,", 1),
    lambda t: t.rsplit("\n", 1)[0],
])
def test_the_canonical_reader_reads_nothing_but_canonical_text(edit) -> None:
    text = _lora()
    assert "omap=(1,)" in text and "{frange=" in text
    bad = edit(text)
    assert bad != text
    with pytest.raises(Exception):  # noqa: B017  (any error: the checker rejects on every one)
        read_program(bad, True)


def test_a_certificate_with_a_hand_written_program_text_is_rejected() -> None:
    # the checker reads the canonical text only; the same program written otherwise (a comment line), its hash
    # recomputed, is a rejection naming the programs
    from verimirage.smt.certificate import check_text, sha256

    d = json.loads((ROOT / "proofs" / "lora_bs1.json").read_text())
    d["mugraph_text"] = d["mugraph_text"].replace("\n", "\n# hand-written\n", 1)
    d["mugraph_sha256"] = sha256(d["mugraph_text"])
    assert vm.MuGraph.parse(d["mugraph_text"]) is not None  # (a text the parser of hand-written text reads)
    v = check_text(json.dumps(d))
    assert not v.proved and "programs:" in v.reason, v.reason


@pytest.mark.parametrize("level", ["custom", "fused"])
def test_a_kernel_node_carried_an_attribute_the_printer_does_not_show(level: str) -> None:
    # trusted21's note: check() accepted a custom (or fused) node with an attribute besides its block (thread) graph,
    # and the printer, which shows a custom node's block graph only, printed the committed text letter for letter: a
    # μGraph in memory (what vm.compile runs) could differ from its certificate's text. Such a node is now an error
    from dataclasses import replace

    from verimirage.ir.errors import GraphError

    mg = vm.MuGraph.parse(json.loads((ROOT / "proofs" / "gated_mlp_bs1.json").read_text())["mugraph_text"])
    mg.check()
    text = str(mg)
    nodes = mg._nodes
    k = next(i for i, n in enumerate(nodes) if n.op == "custom")
    if level == "custom":
        nodes[k] = replace(nodes[k], attrs=(*nodes[k].attrs, ("zz_hidden", 1)))
    else:
        bg = nodes[k].attr("block")
        j = next(i for i, n in enumerate(bg.nodes) if n.op == "fused")
        bnodes = list(bg.nodes)
        bnodes[j] = replace(bnodes[j], attrs=(*bnodes[j].attrs, ("zz_hidden", 1)))
        nodes[k] = replace(nodes[k], attrs=(("block", replace(bg, nodes=tuple(bnodes))),))
    assert str(mg) == text  # (the printer does not show it: so the check must refuse it)
    with pytest.raises(GraphError, match=f"{level}: expected one attribute"):
        mg.check()
