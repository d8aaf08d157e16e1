# Sourced by the device scripts (benchmarks/verify_*.sh): installs the wheels carried in .whl/ (z3; see
# benchmarks/results/verify_times_device.md) into /tmp/site and puts it and the repository on PYTHONPATH.
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl \
  && export PYTHONPATH=/tmp/site:$PWD || exit
export PYTHONUNBUFFERED=1
