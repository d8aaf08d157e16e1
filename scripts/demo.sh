#!/usr/bin/env bash
# Set up (scripts/setup.sh) and run the main job: superoptimize a suite program end to end.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
# shellcheck disable=SC1091
. .venv/bin/activate
python examples/quickstart.py "$@"
