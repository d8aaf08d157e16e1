#!/usr/bin/env bash
# Set up (scripts/setup.sh), then ruff, mypy and the tests on a CPU-only machine.
#
#   bash scripts/test.sh            the default (fast) tier: every test not marked slow
#   bash scripts/test.sh --slow     only the tests marked @pytest.mark.slow (no lint)
#   bash scripts/test.sh --all      both tiers in one run (what CI runs, via .ci/run)
#   bash scripts/test.sh --heavy    only the tests marked @pytest.mark.heavy (minutes each on 2 cores: the
#                                   whole-block capture modules); no other tier runs them
#
# The tests run in parallel with pytest-xdist, one worker per core (VM_TEST_WORKERS=N to choose, 0 for one
# process). Any further arguments go to pytest (e.g. bash scripts/test.sh -k certificate).
set -euo pipefail
cd "$(dirname "$0")/.."
tier=fast
case "${1:-}" in
  --fast) tier=fast; shift ;;
  --slow) tier=slow; shift ;;
  --all) tier=all; shift ;;
  --heavy) tier=heavy; shift ;;
esac
bash scripts/setup.sh
# shellcheck disable=SC1091
. .venv/bin/activate
export TRITON_INTERPRET=1
if [ "$tier" = fast ] || [ "$tier" = all ]; then
  python -m ruff check verimirage tests benchmarks scripts examples
  python -m mypy -p verimirage
fi
# worksteal: an idle worker takes queued tests from a busy one (the slow tests are uneven: 1 s to a minute)
par=(-n "${VM_TEST_WORKERS:-auto}" --dist worksteal)
[ "${VM_TEST_WORKERS:-auto}" = 0 ] && par=(-p no:xdist)
case "$tier" in
  fast) python -m pytest -q -p no:cacheprovider "${par[@]}" -m "not slow and not heavy" "$@" ;;
  slow) python -m pytest -q -p no:cacheprovider "${par[@]}" -m "slow and not heavy" "$@" ;;
  all) python -m pytest -q -p no:cacheprovider "${par[@]}" --durations=25 -m "not heavy" "$@" ;;
  heavy) python -m pytest -q -p no:cacheprovider "${par[@]}" -m heavy "$@" ;;
esac
