"""Per file of the trusted path, the functions none of whose body lines ran under the checker's line tracer.

``python never_run_functions.py HITS.json [ROOT]``: HITS.json is what ``../trusted_cut_2026-11-26/timechild_lines.py
--trace --out=HITS.json`` wrote; ROOT the checkout whose files were traced (default the current directory). Prints
each file's non-blank line count and its never-run functions (line, name, non-blank lines; a nested function is
listed too, inside its parent's count).
"""

import ast
import json
import sys
from pathlib import Path

FILES = ["checkproc"] + [f"{d}/{m}" for d, ms in (("ir", "check dtypes errors graph interpret limits ops text"),
                                                  ("smt", "abstract certificate consts defined ffref glue limits "
                                                          "verdict z3enc")) for m in ms.split()]


def main() -> None:
    root = Path(sys.argv[2]) if len(sys.argv) > 2 else Path.cwd()
    hits = json.loads(Path(sys.argv[1]).read_text())["hits"]
    for f in (f"verimirage/{x}.py" for x in FILES):
        src = (root / f).read_text()
        lines = src.splitlines()
        h = next((set(v) for k, v in hits.items() if k.endswith(f)), set())

        def nonblank(a: int, b: int, lines: list[str] = lines) -> int:
            return sum(1 for ln in lines[a - 1 : b] if ln.strip())

        dead = sorted((n.lineno, n.name, nonblank(n.lineno, n.end_lineno or n.lineno)) for n in ast.walk(ast.parse(src))
                      if isinstance(n, ast.FunctionDef)
                      and not set(range(n.body[0].lineno, (n.end_lineno or n.lineno) + 1)) & h)
        total = sum(1 for ln in lines if ln.strip())
        print(f"== {f} {total} nonblank; never-run functions: {sum(d[2] for d in dead)} lines")
        for line, name, count in dead:
            print(f"   {line:4d} {name} ({count})")


if __name__ == "__main__":
    main()
