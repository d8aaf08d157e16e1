#!/usr/bin/env bash
# Set up a virtual environment with everything verimirage needs (CPU-only machine is fine).
# torch is installed first from its CPU build (torch==2.13.0), so that the package's `torch>=2.4`
# requirement is already met and pip does not pull a multi-GB CUDA build.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
[ -x .venv/bin/python ] || "$PY" -m venv .venv
# shellcheck disable=SC1091
. .venv/bin/activate
# -qq: pip's errors only (its warnings about a machine's index settings filled the demo's stderr)
python -m pip install -qq torch==2.13.0
python -m pip install -qq -e '.[dev,test]'
