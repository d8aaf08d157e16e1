# Sourced by the device scripts (benchmarks/verify_*.sh, GPU test runs): puts the verifier's and the search's native
# dependencies on PYTHONPATH (/tmp/site) with the repository. They travel in the ignored folder .whl/, passed in the
# call's carry: either .whl/site.tar.xz (z3 and egglog with their pure-Python dependencies, stripped:
# scripts/pack_device_site.sh) or wheels (.whl/*.whl, e.g. z3 alone; benchmarks/results/verify_times_device.md).
if [ -f .whl/site.tar.xz ]; then
  mkdir -p /tmp/site && tar -C /tmp/site -xJf .whl/site.tar.xz || return 1 2>/dev/null || exit 1
else
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl \
    || return 1 2>/dev/null || exit 1
fi
export PYTHONPATH=/tmp/site:$PWD
export PYTHONUNBUFFERED=1
