"""Non-blank and code lines of each file of the trusted path (code: lines holding a token that is neither a
comment nor a docstring), as tests/test_certificate.py::test_trusted_path_line_count and README count them.

    python lines.py ROOT     (ROOT: a checkout of the repository)
"""

import io
import sys
import tokenize
from pathlib import Path

FILES = [f"verimirage/{f}.py" for f in ("ir/check", "ir/dtypes", "ir/errors", "ir/graph", "ir/interpret", "ir/limits",
                                         "ir/ops", "ir/text", "smt/abstract", "smt/certificate", "smt/consts",
                                         "smt/defined", "smt/ffref", "smt/glue", "smt/limits", "smt/verdict",
                                         "smt/z3enc", "checkproc")]
SKIP = (tokenize.COMMENT, tokenize.NL, tokenize.NEWLINE, tokenize.INDENT, tokenize.DEDENT, tokenize.ENDMARKER)


def counts(src: str) -> tuple[int, int]:
    code: set[int] = set()
    prev = None
    for tok in tokenize.generate_tokens(io.StringIO(src).readline):
        if tok.type in SKIP:
            prev = tok if tok.type == tokenize.NEWLINE else prev
            continue
        starts = prev is None or prev.type in (tokenize.NEWLINE, tokenize.INDENT, tokenize.DEDENT)
        prev = tok
        if tok.type == tokenize.STRING and starts:  # (a statement that is a bare string: a docstring)
            continue
        code.update(range(tok.start[0], tok.end[0] + 1))
    lines = src.splitlines()
    return sum(1 for ln in lines if ln.strip()), sum(1 for i in code if lines[i - 1].strip())


root = Path(sys.argv[1])
total = [0, 0]
for f in FILES:
    n, c = counts((root / f).read_text())
    total = [total[0] + n, total[1] + c]
    print(f"{f} {n} (code {c})")
print(f"total {total[0]} (code {total[1]})")
