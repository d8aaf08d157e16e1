"""Time ``check_certificate`` on named proofs: wall and child-process CPU seconds, peak memory (run from the root)."""

import resource
import sys
import time

sys.path.insert(0, ".")
from verimirage.checkcall import check_certificate  # (smt.certificate until session 17)

tot = 0.0
for n in sys.argv[1:]:
    r0 = resource.getrusage(resource.RUSAGE_CHILDREN)
    t = time.perf_counter()
    v = check_certificate(f"proofs/{n}.json", triton=False)
    r1 = resource.getrusage(resource.RUSAGE_CHILDREN)
    dt = time.perf_counter() - t
    cpu = (r1.ru_utime + r1.ru_stime) - (r0.ru_utime + r0.ru_stime)
    tot += cpu
    print(f"{dt:7.2f} wall {cpu:7.2f} cpu {r1.ru_maxrss / 1024:6.0f}MB {v.proved} {n}", flush=True)
print("total cpu", round(tot, 2))
