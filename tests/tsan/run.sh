#!/usr/bin/env bash
# The unit and integration suites under ThreadSanitizer (CI's thread
# sanitizer stage): builds BUILD_DIR with FERRY_SANITIZE=thread, runs
# ctest on the two labels with every process's reports written under
# BUILD_DIR/tsan-reports (the daemons' included: they inherit
# TSAN_OPTIONS), and fails when a test fails or any report was written.
#
#   tests/tsan/run.sh [BUILD_DIR]     default ./build-tsan
#   extra ctest arguments: FERRY_TSAN_CTEST_ARGS="-R partitions"
#
# UCX_MEM_EVENTS=no: UCX's memory hooks patch mmap and munmap, which
# TSan intercepts itself; with both, Criterion's test processes crash at
# exit. No UCX transport Ferry uses (TCP here) needs them.
#
# Code runs 5 to 15 times slower under TSan, and the suites' timing is
# off by as much: a test that fails runs once more (ctest --repeat
# until-pass:2) and fails the stage only if it fails again; both runs'
# output is printed. Any report, from either run, fails it.
# report_thread_leaks=0: a test that fails an assertion exits without
# freeing its client, whose threads TSan then reports as leaked, a
# second report of the failure already counted.
set -euo pipefail
root=$(cd "$(dirname "$0")/../.." && pwd)
# Absolute: the daemons write their reports from their own directories.
build=$(realpath -m "${1:-$root/build-tsan}")
reports=$build/tsan-reports
cmake -S "$root" -B "$build" -DCMAKE_BUILD_TYPE=RelWithDebInfo \
  -DFERRY_WERROR=ON -DFERRY_WITH_CUDA=OFF -DFERRY_SANITIZE=thread
cmake --build "$build" -j "$(nproc)"
rm -rf "$reports"
mkdir -p "$reports"
rc=0
UCX_MEM_EVENTS=no \
TSAN_OPTIONS="halt_on_error=1:second_deadlock_stack=1:report_thread_leaks=0:log_path=$reports/report:suppressions=$root/tests/tsan/tsan.supp" \
  ctest --test-dir "$build" --output-on-failure -j "$(nproc)" \
  --repeat until-pass:2 \
  -L '^(unit|integration)$' ${FERRY_TSAN_CTEST_ARGS:-} || rc=$?
found=$(find "$reports" -type f | wc -l)
if [ "$found" -gt 0 ]; then
  for f in "$reports"/*; do
    echo "==== $f"
    cat "$f"
  done
  echo "tests/tsan/run.sh: ThreadSanitizer wrote $found report(s), above"
  rc=1
else
  echo "tests/tsan/run.sh: no ThreadSanitizer report"
fi
exit "$rc"
