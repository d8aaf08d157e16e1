"""The certificate checker's process: what it runs first, before it imports anything of verimirage.

:data:`_CHILD` sets the process up so that it cannot import the verifier's modules (:data:`REFUSED`), then runs
``smt.certificate._child_main``: read the request on stdin, cap memory, check, write the verdict as JSON with the
sha256 of the text it checked. Standard library only. Starting the process and sending it the request is the
calling side's (:mod:`verimirage.checkcall`: not trusted, it cannot make a Proved).
"""

#: modules the checker process refuses to import (the verifier's fast paths, the search, the backend)
REFUSED = ("verimirage.smt.ff", "verimirage.smt.verify", "verimirage.smt.prune",
           "verimirage.rewrite", "verimirage.backend", "verimirage.pipeline", "verimirage.testing", "torch", "triton",
           "egglog", "verimirage.ir.builders", "verimirage.ir.reference", "verimirage.ir.opfacts",
           "verimirage.ir.parse", "verimirage.ir.serial", "verimirage.ir.dot", "verimirage.ir.svg",
           "verimirage.smt.certify", "verimirage.smt.axioms", "verimirage.smt.budget", "verimirage.smt.reading",
           "verimirage.integrations", "verimirage.benchmarks", "verimirage.checkcall", "verimirage.smt.deep")

#: the checker process's code (argv: this checkout's root, then the caller's path). The packages ``verimirage``,
#: ``verimirage.ir`` and ``verimirage.smt`` are bare modules there: their ``__init__`` files (the public names'
#: lazy loaders and re-exports) never run in it; the checker imports the modules it uses by their full names.
_CHILD = """
import os, sys, types
sys.path[:0] = sys.argv[1:]
for pkg in ("verimirage", "verimirage.ir", "verimirage.smt"):
    sys.modules[pkg] = types.ModuleType(pkg)
    sys.modules[pkg].__path__ = [os.path.join(sys.argv[1], *pkg.split("."))]
class _Refuse:
    def find_spec(self, name, path=None, target=None):
        if any(name == r or name.startswith(r + ".") for r in {refused!r}):
            raise ImportError("the certificate checker does not use " + name)
        return None
sys.meta_path.insert(0, _Refuse())
from verimirage.smt.certificate import _child_main
_child_main()
sys.stdout.flush()
sys.stderr.flush()
os._exit(0)  # (the verdict is written: no interpreter teardown, 0.1-0.2 s after a check of big arrays)
"""
