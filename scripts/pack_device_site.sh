#!/usr/bin/env bash
# Packs the verifier's and the search's native dependencies for the GPU machine (Python 3.12, no network, no
# egglog or z3 installed; a call carries at most 64 MiB) into .whl/site.tar.xz (~17 MB): z3-solver and egglog with
# their pure-Python dependencies, installed for CPython 3.12 and their shared objects stripped.
# benchmarks/device_env.sh unpacks it on the device when it is there. Run from the repository root:
#     bash scripts/pack_device_site.sh
set -euo pipefail
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
pip download -q --only-binary=:all: --python-version 3.12 --no-deps -d "$work/wheels" \
  z3-solver==5.4.1.0 egglog cloudpickle opentelemetry-api importlib-metadata zipp graphviz black click \
  mypy_extensions packaging pathspec platformdirs pytokens 2> >(grep -v 'is ignored' >&2)
mkdir -p "$work/site"
for w in "$work"/wheels/*.whl; do unzip -q -o "$w" -d "$work/site"; done  # (a wheel is a zip of site-packages)
find "$work/site" -name '*.so*' -type f -exec strip --strip-unneeded {} +
rm -rf "$work"/site/bin
mkdir -p .whl
tar -C "$work/site" -cJf .whl/site.tar.xz .
ls -la .whl/site.tar.xz
