#!/usr/bin/env bash
# Set up (scripts/setup.sh) and run the whole test suite on a CPU-only machine.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
# shellcheck disable=SC1091
. .venv/bin/activate
export TRITON_INTERPRET=1
python -m ruff check verimirage tests benchmarks scripts examples
python -m mypy -p verimirage
python -m pytest -q -p no:cacheprovider "$@"
