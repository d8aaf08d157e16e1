#!/usr/bin/env bash
# Rule synthesis and sweeps on the GPU machine's CPU cores (issue 25). The device has no egglog: make the
# carried site first (bash scripts/make_devsite.sh -> .devsite/site.tar.xz), copy the repository with it into a
# carried folder, and run this there; every argument goes to benchmarks/rules_sweep.py. See benchmarks/README.md.
#
#   bash benchmarks/rules_sweep_device.sh --processes 0 --no-serial --also-full --loto --out "$OUT/rules"
set -euo pipefail
cd "$(dirname "$0")/.."
site=${DEVSITE:-.devsite/site.tar.xz}
mkdir -p /tmp/site
tar -xJf "$site" -C /tmp/site
export PYTHONPATH=/tmp/site:$PWD${PYTHONPATH:+:$PYTHONPATH} PYTHONUNBUFFERED=1
python3 -c "import egglog, z3; print('egglog', egglog.__file__, 'z3', z3.get_version_string())"
exec python3 benchmarks/rules_sweep.py "$@"
