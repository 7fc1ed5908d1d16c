#!/usr/bin/env bash
# The whole test suite, from a fresh Debian 12 machine: installs what it
# needs, builds with warnings as errors, and runs every test with ctest
# (unit, conformance, benchmark smoke runs, TensorFlow interop).
#
#   tests/run.sh                 everything but the "slow" label
#   FERRY_BUILD_DIR=DIR          build somewhere other than ./build
#   FERRY_SKIP_INTEROP=1         skip the TensorFlow interop test
#   FERRY_SLOW_TESTS=1           also run the tests labelled "slow" (the
#                                trainer-gpu image recipe: ~5 min more)
#   extra arguments go to ctest, e.g. tests/run.sh -L unit
# At the end it lists each skipped test with the reason it printed
# (tests/skip_report.py).
set -euo pipefail

root=$(cd "$(dirname "$0")/.." && pwd)
build=${FERRY_BUILD_DIR:-$root/build}
jobs=$(nproc)

"$root/deploy/install-deps.sh"
cmake -S "$root" -B "$build" -DCMAKE_BUILD_TYPE=RelWithDebInfo \
  -DFERRY_WERROR=ON ${FERRY_CMAKE_ARGS:-}
cmake --build "$build" -j "$jobs"
slow=(-LE slow)
[ "${FERRY_SLOW_TESTS:-0}" != 1 ] || slow=()
# The skipped tests and why (ctest says only "Skipped"): from its JUnit
# report, whose output per test is kept whole enough to hold the reason.
junit=$build/Testing/ferry-junit.xml
rm -f "$junit"
rc=0
ctest --test-dir "$build" --output-on-failure -j "$jobs" \
  --output-junit "$junit" --test-output-size-passed 65536 \
  "${slow[@]}" "$@" || rc=$?
if [ -f "$junit" ]; then
  python3 "$root/tests/skip_report.py" "$junit"
else
  echo "tests/run.sh: ctest wrote no $junit: skip reasons not listed"
fi
exit "$rc"
