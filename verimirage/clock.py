"""The clock of the search's time budgets: CPU seconds, not wall-clock seconds (twenty-first session).

A search's ``time_budget_s`` (the lowering's cut-off, the verification loop's stop, the e-graph's saturation) was
measured on the wall clock, so the same program searched on a busy machine (7-8 sessions sharing 2 cores) verified
fewer candidates, and sometimes chose another design, than on an idle one: the process waited for a core while the
budget ran. :func:`cpu_seconds` counts only the CPU the search itself used: every thread of the process (the
finite-field trials' workers, egglog, Z3) and its children that have ended (a worker process the search waited for).
"""

from __future__ import annotations

import time

try:
    import resource
except ImportError:  # (not on Windows: the process's own CPU only)
    resource = None  # type: ignore[assignment]


def cpu_seconds() -> float:
    """CPU seconds (user + system) used so far by this process's threads and its waited-for children: only
    differences of two readings mean anything."""
    own = time.process_time()
    if resource is None:
        return own
    ch = resource.getrusage(resource.RUSAGE_CHILDREN)
    return own + ch.ru_utime + ch.ru_stime
