"""The documentation is tested: generated pages are current, links resolve, every ``python`` block runs,
every CLI command has its page."""

from __future__ import annotations

import contextlib
import io
import os
import re
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
DOCS = ROOT / "docs"
PAGES = sorted([ROOT / "README.md", *DOCS.rglob("*.md")])
#: pages whose code blocks take more than a few seconds on the 2-core machine (searches, torch.compile)
SLOW_PAGES = {"docs/guide.md"}

sys.path.insert(0, str(ROOT / "scripts"))
import gen_docs  # noqa: E402

REGEN = "regenerate with: python scripts/gen_docs.py (and commit docs/ops.md, docs/api.md)"


def _rel(p: Path) -> str:
    return p.relative_to(ROOT).as_posix()


def test_the_docs_exist() -> None:
    for name in ("guide.md", "api.md", "ops.md", "architecture.md", "cli/index.md"):
        assert (DOCS / name).is_file(), f"docs/{name} is missing"


def test_ops_page_is_current() -> None:
    from verimirage.ir.ops import OPS

    text = gen_docs.ops_page()
    assert (DOCS / "ops.md").read_text() == text, f"docs/ops.md is stale (the op registry changed); {REGEN}"
    for name in OPS:  # and it really lists every op
        assert f"| `{name}` |" in text


def test_api_page_covers_every_public_name() -> None:
    # docs/api.md is generated from docstrings, which change often; it must name every public name and every
    # public method of the classes it details (the wording may lag a docstring edit until it is regenerated)
    import verimirage as vm

    fresh = gen_docs.api_page()
    page = (DOCS / "api.md").read_text()
    names = [f"`vm.{n}`" for n in vm.__all__]
    names += re.findall(r"^- `(\.[A-Za-z_][A-Za-z0-9_]*)", fresh, flags=re.M)
    missing = sorted({n for n in names if n not in page})
    assert not missing, f"docs/api.md does not document {missing}; {REGEN}"


_LINK = re.compile(r"\[[^\]]*\]\(([^)\s]+)\)")


@pytest.mark.parametrize("page", PAGES, ids=_rel)
def test_relative_links_resolve(page: Path) -> None:
    text = page.read_text()
    bad = []
    for target in _LINK.findall(text):
        if re.match(r"^[a-z]+:", target) or target.startswith("#"):
            continue
        path = target.split("#", 1)[0]
        resolved = (page.parent / path).resolve()
        if not resolved.exists() or ROOT not in resolved.parents:
            bad.append(target)
    assert not bad, f"{_rel(page)} links to files that are not in the repository: {bad}"
    assert "shared/" not in text, f"{_rel(page)} mentions a file outside the repository"


def _blocks(page: Path) -> list[str]:
    return re.findall(r"^```python\n(.*?)^```", page.read_text(), flags=re.S | re.M)


def _page_param(p: Path) -> object:
    return pytest.param(p, marks=pytest.mark.slow) if _rel(p) in SLOW_PAGES else p


@pytest.mark.parametrize("page", [_page_param(p) for p in PAGES if _blocks(p)], ids=_rel)
def test_python_blocks_run(page: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)  # blocks may write files
    ns: dict[str, object] = {"__name__": f"docs_{page.stem}"}
    for i, src in enumerate(_blocks(page)):
        out = io.StringIO()
        try:
            with contextlib.redirect_stdout(out):
                exec(compile(src, f"{_rel(page)} block {i + 1}", "exec"), ns)
        except Exception as e:
            raise AssertionError(f"{_rel(page)}, python block {i + 1} failed: {type(e).__name__}: {e}\n{src}") from e


def test_every_page_with_code_is_tested() -> None:
    assert any(_blocks(p) for p in PAGES if p.name == "README.md"), "README.md has no python block"
    assert sum(len(_blocks(p)) for p in PAGES) >= 10


def test_every_cli_command_has_a_page() -> None:
    import argparse

    from verimirage.cli import build_parser

    parser = build_parser()
    sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    index = (DOCS / "cli" / "index.md").read_text()
    for name, p in sub.choices.items():
        page = DOCS / "cli" / f"{name}.md"
        assert page.is_file(), f"the CLI command {name!r} has no page docs/cli/{name}.md"
        assert f"({name}.md)" in index, f"docs/cli/index.md does not link {name}.md"
        text = page.read_text()
        for action in p._actions:
            for opt in action.option_strings:
                if opt not in ("-h", "--help"):
                    assert opt in text, f"docs/cli/{name}.md does not explain {opt}"
    for opt in ("-v", "VERIMIRAGE_LOG"):
        assert opt in index


def test_readme_keeps_its_two_commands() -> None:
    text = (ROOT / "README.md").read_text()
    assert "bash scripts/demo.sh" in text and "bash scripts/test.sh" in text
    assert os.access(ROOT / ".ci" / "run", os.X_OK)
