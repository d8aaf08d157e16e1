"""Check every certificate given with the independent checker (vm.check_certificate: the capped child process, the
Triton hash regenerated) and write each one's (proved, reason) as JSON, to compare two checkouts' verdicts.

    python recheck.py OUT.json proofs/*.json benchmarks/candidates/layer_np/proofs/*.json   (from a checkout's root)
"""

import json
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path.cwd()))  # (run as a file, the checkout's verimirage is not on the path: the venv's is)
import verimirage as vm

print("verimirage from", vm.__file__, flush=True)

out = {}
for f in sys.argv[2:]:
    t = time.time()
    v = vm.check_certificate(f)
    out[f] = [v.proved, v.reason]
    print(f, v.proved, round(time.time() - t, 1), v.reason[:150], flush=True)
    Path(sys.argv[1]).write_text(json.dumps(out, indent=1))  # (after each one: a stopped run keeps what it did)
