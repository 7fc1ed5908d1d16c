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
ctest --test-dir "$build" --output-on-failure -j "$jobs" "${slow[@]}" "$@"
