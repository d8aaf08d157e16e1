"""Check committed certificates in the checker's own child process (as :mod:`verimirage.checkproc` starts it):
its CPU seconds, and with ``--trace`` the lines of verimirage (but the normaliser) it executed.

Run from a checkout's root: ``python timechild_lines.py [--trace] [--out=FILE] [NAME ...]`` (NAME: a substring of
the certificate paths, default all of ``proofs/`` and the layer's). Prints one line per certificate (verdict, wall
and child CPU seconds); ``--out`` gets the executed lines (``--trace``) and the files the child loaded, as JSON.
"""

import glob
import json
import resource
import subprocess
import sys
import time
from pathlib import Path

root = Path.cwd()
sys.path.insert(0, str(root))
from verimirage import checkproc as C  # noqa: E402
from verimirage.smt.certify import known_rules  # noqa: E402  (smt.certificate until session 17)

TRACER = """
import sys as _s, threading as _t
_hits = {}
def _tr(frame, event, arg):
    f = frame.f_code.co_filename
    if 'verimirage' not in f or f.endswith('expr.py'):
        return None
    def _l(frame, event, arg):
        if event == 'line':
            _hits.setdefault(frame.f_code.co_filename, set()).add(frame.f_lineno)
        return _l
    _hits.setdefault(f, set()).add(frame.f_code.co_firstlineno)
    return _l
_s.settrace(_tr)
_t.settrace(_tr)
"""
SHOW_HITS = "import json as _j; print(_j.dumps({k: sorted(v) for k, v in _hits.items()}))\n"
SHOW_FILES = ("print(sorted(m.__file__ for n, m in sys.modules.items() if n.startswith('verimirage') and "
              "getattr(m, '__file__', None)))\n")


def main() -> None:
    trace = "--trace" in sys.argv
    out = next((a[6:] for a in sys.argv if a.startswith("--out=")), None)
    code = C._CHILD.format(refused=C.REFUSED)
    show = (SHOW_HITS if trace else "") + SHOW_FILES
    if trace:
        code = code.replace("sys.path[:0] = sys.argv[1:]\n", "sys.path[:0] = sys.argv[1:]\n" + TRACER, 1)
    code = code.replace("_child_main()\n", "_child_main()\n" + show, 1)
    path = [str(root), *(p for p in sys.path if Path(p).is_absolute() and p != str(root))]
    proofs = sorted(glob.glob("proofs/*.json")) + sorted(glob.glob("benchmarks/candidates/layer_np/proofs/*.json"))
    only = [a for a in sys.argv[1:] if not a.startswith("--")]
    proofs = [p for p in proofs if not only or any(o in p for o in only)]
    hits: dict[str, set[int]] = {}
    files: set[str] = set()
    for p in proofs:
        req = json.dumps({"certificate": Path(p).read_text(), "known_rules": sorted(known_rules()),
                          "timeout_s": 600.0, "memory_mb": 0})
        t0, r0 = time.time(), resource.getrusage(resource.RUSAGE_CHILDREN)
        r = subprocess.run([sys.executable, "-I", "-S", "-c", code, *path], input=req, capture_output=True,
                           text=True, cwd=root, timeout=3000)
        r1 = resource.getrusage(resource.RUSAGE_CHILDREN)
        lines = r.stdout.strip().splitlines()
        verdict, loaded = lines[-2 - trace], lines[-1]
        if trace:
            for k, v in json.loads(lines[-2]).items():
                hits.setdefault(k, set()).update(v)
        files.update(json.loads(loaded.replace("'", '"')))
        cpu = r1.ru_utime - r0.ru_utime + r1.ru_stime - r0.ru_stime
        print(p, json.loads(verdict).get("proved"), f"wall {time.time() - t0:.1f} cpu {cpu:.1f}", flush=True)
    if out:
        Path(out).write_text(json.dumps({"hits": {k: sorted(v) for k, v in hits.items()}, "files": sorted(files)}))


if __name__ == "__main__":
    main()
