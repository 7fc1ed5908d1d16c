#!/usr/bin/env bash
# tests/run.sh lists each skipped test with its reason (the README says
# skipped tests print why; ctest alone says only "Skipped"): a small ctest
# project with a SKIP_RETURN_CODE test, a SKIP_REGULAR_EXPRESSION test, a
# test that prints no reason and a passing one, run with tests/run.sh's
# ctest flags, then tests/skip_report.py on its JUnit file.
set -euo pipefail
root=$(cd "$(dirname "$0")/../.." && pwd)
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
fail=0
for flag in --output-junit --test-output-size-passed skip_report.py; do
  grep -q -- "$flag" "$root/tests/run.sh" ||
    { echo "FAIL: tests/run.sh does not use $flag"; fail=1; }
done
cat >"$work/CMakeLists.txt" <<'X'
cmake_minimum_required(VERSION 3.25)
project(skips NONE)
enable_testing()
add_test(NAME t/skip77 COMMAND sh -c "seq 2000; echo 'SKIP: podman is not installed'; exit 77")
set_tests_properties(t/skip77 PROPERTIES SKIP_RETURN_CODE 77)
add_test(NAME t/skipre COMMAND sh -c "echo 'skipping: no GPU'")
set_tests_properties(t/skipre PROPERTIES SKIP_REGULAR_EXPRESSION "skipping:")
add_test(NAME t/silent COMMAND sh -c "echo one; echo last words; exit 77")
set_tests_properties(t/silent PROPERTIES SKIP_RETURN_CODE 77)
add_test(NAME t/pass COMMAND sh -c "echo fine")
X
cmake -S "$work" -B "$work/b" >/dev/null
ctest --test-dir "$work/b" --output-junit "$work/junit.xml" \
  --test-output-size-passed 65536 >/dev/null
out=$(python3 "$root/tests/skip_report.py" "$work/junit.xml")
echo "$out"
for want in "3 test(s) skipped" "t/skip77 (SKIP_RETURN_CODE=77):" \
    "SKIP: podman is not installed" "skipping: no GPU" "last words"; do
  grep -qF -- "$want" <<<"$out" || { echo "FAIL: the report lacks '$want'"; fail=1; }
done
if grep -q "t/pass" <<<"$out"; then echo "FAIL: a passed test is listed"; fail=1; fi
[ "$fail" -eq 0 ] && echo "skip report: all checks passed"
exit "$fail"
