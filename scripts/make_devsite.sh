#!/usr/bin/env bash
# Pack egglog and z3 (and egglog's pure-Python needs the GPU machine lacks) for the device machine's Python 3.12
# into .devsite/site.tar.xz (git-ignored, ~11 MB): the manylinux cp312 wheels, unpacked, their shared libraries
# stripped (egglog's is 219 MB with symbols, 11 MB without), z3's command-line binary and headers left out.
# The device has no egglog and no search runs there without it; benchmarks/rules_sweep_device.sh unpacks this to
# /tmp/site. Versions: those of this machine's environment (EGGLOG=..., Z3=... to choose).
#
#   bash scripts/make_devsite.sh            # then carry .devsite (see benchmarks/README.md)
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-.venv/bin/python}
[ -x "$PY" ] || PY=python3
ver() { "$PY" -m pip show "$1" 2>/dev/null | sed -n 's/^Version: //p'; }
EGGLOG=${EGGLOG:-$(ver egglog)}
Z3=${Z3:-$(ver z3-solver)}
[ -n "$EGGLOG" ] && [ -n "$Z3" ] || { echo "make_devsite: egglog / z3-solver not installed here; set EGGLOG= and Z3=" >&2; exit 1; }
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
plat=(--platform manylinux_2_28_x86_64 --platform manylinux_2_27_x86_64 --platform manylinux_2_17_x86_64
      --platform manylinux2014_x86_64 --platform manylinux1_x86_64)
"$PY" -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp "${plat[@]}" \
  -d "$work/whl" "egglog==$EGGLOG" "z3-solver==$Z3"
# egglog imports these at import time; the device image has cloudpickle, typing-extensions, click, packaging,
# pathspec and mypy-extensions already
for pkg in black graphviz opentelemetry-api platformdirs pytokens; do
  v=$(ver "$pkg")
  "$PY" -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation py --abi none \
    --platform any -d "$work/whl" "$pkg${v:+==$v}"
done
mkdir -p "$work/site"
for w in "$work"/whl/*.whl; do unzip -q -o "$w" -d "$work/site"; done
rm -rf "$work"/site/z3_solver-*.data "$work/site/z3/include"
find "$work/site" -name '*.so*' -type f -exec strip --strip-unneeded {} +
for lib in "$work"/site/z3/lib/libz3.so.*; do [ -f "$lib" ] && ln -sf libz3.so "$lib"; done
mkdir -p .devsite
tar -cJf .devsite/site.tar.xz -C "$work/site" .
ls -la .devsite/site.tar.xz
