#!/usr/bin/env bash
# Two deploy/demo.sh on one work directory: the second must refuse with a
# message naming the first's pid and leave the first's files alone (it
# used to rm -rf them). The first demo is stood in for by a process
# this shell holding DIR.lock, as a running demo does. And --help lists
# the demo's settings. No build needed.
set -euo pipefail
root=$(cd "$(dirname "$0")/../.." && pwd)
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
demo=$work/demo
mkdir -p "$demo/data"
echo first >"$demo/data/marker"
# The first demo: this shell holds the lock and wrote its pid into it, as
# a running demo does.
exec 8>>"$demo.lock"
flock -n 8 || { echo "FAIL: could not take $demo.lock"; exit 1; }
echo $$ >"$demo.lock"
rc=0
FERRY_DEMO_DIR=$demo/ FERRY_DEMO_NO_BUILD=1 FERRY_BUILD_DIR=$work/no-build \
  timeout 30 "$root/deploy/demo.sh" >"$work/out" 2>&1 || rc=$?
fail=0
if [ "$rc" = 1 ] && grep -q "another demo (pid $(cat "$demo.lock")) is using $demo" "$work/out"; then
  echo "ok: the second demo refused: $(head -n 1 "$work/out")"
else
  echo "FAIL: the second demo exited $rc (want 1 and a message naming the first); its output:"
  sed 's/^/  | /' "$work/out"
  fail=1
fi
if [ "$(cat "$demo/data/marker" 2>/dev/null)" = first ]; then
  echo "ok: the first demo's files are intact"
else
  echo "FAIL: the second demo removed the first demo's files"
  fail=1
fi
# deploy/demo.sh --help: a new user's first try printed one usage line and
# exited 2; it prints the settings (the comment at its top) and exits 0,
# starting nothing.
rc=0
timeout 10 "$root/deploy/demo.sh" --help >"$work/help" 2>&1 || rc=$?
if [ "$rc" = 0 ] && grep -q "^usage: deploy/demo.sh" "$work/help" &&
    grep -q "FERRY_DEMO_DIR=DIR" "$work/help" &&
    grep -q "FERRY_DEMO_NO_BUILD=1" "$work/help"; then
  echo "ok: deploy/demo.sh --help lists its settings"
else
  echo "FAIL: deploy/demo.sh --help exited $rc without its settings:"
  sed 's/^/  | /' "$work/help"
  fail=1
fi
exit "$fail"
