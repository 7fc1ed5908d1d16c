#!/usr/bin/env bash
# deploy/demo.sh, the README's main command, must leave no process behind:
# run it on a small dataset to the end, then again interrupted
# with SIGINT once its cluster and trainer run (to the demo alone, and to
# its whole process group as a terminal's Ctrl-C does), and check after
# each run that no process it started (FERRY_DEMO_PIDFILE) still exists
# and that it said so, and that none of them needed the demo's SIGKILL
# fallback (each must exit on SIGTERM: a fallback is a failed shutdown,
# not a pass). Then `deploy/demo.sh --imagenet` on 600
# ImageNet-like JPEGs to the end: its trainer must get 224x224x3 batches,
# flipped (on the GPU or by the CPU), and print images/s and the stall
# fraction.
#
#   demo_no_leftovers.sh BUILD_DIR
# Every wait is bounded; whatever is left is SIGKILLed before exiting.
set -uo pipefail

build=${1:?usage: demo_no_leftovers.sh BUILD_DIR}
root=$(cd "$(dirname "$0")/../.." && pwd)
tmp=$(mktemp -d /tmp/ferry-demo-test-XXXXXX)
fail=0
export FERRY_BUILD_DIR=$build FERRY_DEMO_NO_BUILD=1 FERRY_DEMO_SKIP_BENCH=1

cleanup() {
  local p
  if [ -f "$tmp/pids" ]; then
    while read -r p _; do kill -KILL "$p" 2>/dev/null || true; done \
      <"$tmp/pids"
  fi
  rm -rf "$tmp"
}
trap cleanup EXIT

say() { echo "demo_no_leftovers: $*"; }
bad() {
  say "FAIL: $*"
  fail=1
}

# leftovers: the processes in the pid file that still exist (zombies
# included: they are this test's grandchildren, reaped by the demo).
leftovers() {
  local p name left=()
  while read -r p name; do
    if kill -0 "$p" 2>/dev/null; then left+=("$name:$p"); fi
  done <"$tmp/pids"
  echo "${left[*]}"
}

# no_sigkill OUT: fails the test when the demo whose output is OUT had to
# SIGKILL a process that did not exit on SIGTERM.
no_sigkill() {
  if grep -q "ignored SIGTERM\|SIGKILL fallback was needed" "$1"; then
    bad "a process needed SIGKILL to stop: $(grep "SIGKILL" "$1" | tr '\n' ' ')"
  fi
}

# wait_for COUNT FILE SECONDS: until FILE has COUNT lines.
wait_for() {
  local deadline=$((SECONDS + $3))
  while [ "$SECONDS" -lt "$deadline" ]; do
    if [ -f "$2" ] && [ "$(wc -l <"$2")" -ge "$1" ]; then return 0; fi
    sleep 0.05
  done
  return 1
}

# wait_exit PID SECONDS: until PID (a child of this shell) has exited.
wait_exit() {
  local deadline=$((SECONDS + $2))
  while [ "$SECONDS" -lt "$deadline" ]; do
    if ! kill -0 "$1" 2>/dev/null; then return 0; fi
    # A zombie child still answers kill -0: check its state.
    local st
    st=$(cat "/proc/$1/stat" 2>/dev/null) || return 0
    st=${st##*) }
    [ "${st:0:1}" = Z ] && return 0
    sleep 0.05
  done
  return 1
}

run_to_the_end() {
  say "run 1: to the end"
  rm -f "$tmp/pids"
  FERRY_DEMO_DIR=$tmp/demo1 FERRY_DEMO_RECORDS=4000 \
    FERRY_DEMO_PIDFILE=$tmp/pids timeout 300 "$root/deploy/demo.sh" \
    >"$tmp/out1" 2>&1
  local rc=$?
  [ "$rc" = 0 ] || bad "the demo exited $rc"
  [ "$(wc -l <"$tmp/pids")" = 4 ] ||
    bad "expected 4 processes in the pid file: $(cat "$tmp/pids")"
  grep -q "all 4 processes this demo started have exited" "$tmp/out1" ||
    bad "the demo did not say that everything exited"
  no_sigkill "$tmp/out1"
  local left
  left=$(leftovers)
  [ -z "$left" ] || bad "left running: $left"
  if [ "$fail" = 1 ]; then tail -n 30 "$tmp/out1"; fi
}

# interrupted N TARGET: SIGINT once the trainer runs, to the demo's shell
# (TARGET=shell) or to its whole process group (TARGET=group, Ctrl-C).
interrupted() {
  local n=$1 target=$2 pid rc left
  say "run $n: SIGINT to the $target while the trainer runs"
  rm -f "$tmp/pids"
  # Its own process group (set -m), as a terminal's foreground job. Many
  # epochs, so that the trainer is still running when the signal comes.
  set -m
  FERRY_DEMO_DIR=$tmp/demo$n FERRY_DEMO_RECORDS=4000 FERRY_DEMO_EPOCHS=100000 \
    FERRY_DEMO_PIDFILE=$tmp/pids "$root/deploy/demo.sh" >"$tmp/out$n" 2>&1 &
  pid=$!
  set +m
  if ! wait_for 4 "$tmp/pids" 120; then
    bad "the demo did not start its cluster and trainer within 120 s"
    tail -n 30 "$tmp/out$n"
    kill -KILL -- -"$pid" 2>/dev/null
    return
  fi
  if [ "$target" = group ]; then kill -INT -- -"$pid"; else kill -INT "$pid"; fi
  if ! wait_exit "$pid" 30; then
    bad "the demo did not exit within 30 s of SIGINT"
    kill -KILL -- -"$pid" 2>/dev/null
  fi
  wait "$pid"
  rc=$?
  [ "$rc" = 130 ] || bad "the demo exited $rc after SIGINT, not 130"
  grep -q "all 4 processes this demo started have exited" "$tmp/out$n" ||
    bad "the demo did not say that everything exited"
  no_sigkill "$tmp/out$n"
  left=$(leftovers)
  [ -z "$left" ] || bad "left running: $left"
  if [ "$fail" = 1 ]; then tail -n 30 "$tmp/out$n"; fi
}

imagenet() {
  say "run 4: --imagenet to the end"
  rm -f "$tmp/pids"
  FERRY_DEMO_DIR=$tmp/demo4 FERRY_DEMO_RECORDS=600 FERRY_DEMO_EPOCHS=1 \
    FERRY_DEMO_STEP_MS=20 FERRY_DEMO_PIDFILE=$tmp/pids \
    timeout 300 "$root/deploy/demo.sh" --imagenet >"$tmp/out4" 2>&1
  local rc=$? left
  [ "$rc" = 0 ] || bad "the --imagenet demo exited $rc"
  grep -q "JPEG quality 90: .* bytes per pixel" "$tmp/out4" ||
    bad "the --imagenet demo did not print the dataset's bytes per pixel"
  grep -Eq "^total \(4 files\): 600 records, 600 JPEGs: 600 rewritten, 0 copied" \
    "$tmp/out4" || bad "the --imagenet demo did not optimize its 600 JPEGs"
  grep -q "data-optimized/train-\*.tfrecord\") | decode(jpeg)" "$tmp/out4" ||
    bad "the --imagenet demo's job does not read the optimized dataset"
  grep -q "decode(jpeg) | random_resized_crop(224) | batch(256)" \
    "$tmp/out4" || bad "the --imagenet demo did not run its spec"
  grep -Eq "first batch: 256 images of 224x224x3, augmented on the GPU|first batch: 256 images of 224x224x3, augmented by the CPU" \
    "$tmp/out4" || bad "no flipped 224x224x3 batch of 256"
  grep -q "end of epoch: 600 records" "$tmp/out4" ||
    bad "the trainer did not get the 600 records"
  grep -Eq "^images/s [0-9]+, stall fraction (0|1)\.[0-9]{3} " \
    "$tmp/out4" || bad "no images/s and stall fraction line"
  grep -q "all 4 processes this demo started have exited" "$tmp/out4" ||
    bad "the --imagenet demo did not say that everything exited"
  no_sigkill "$tmp/out4"
  left=$(leftovers)
  [ -z "$left" ] || bad "left running: $left"
  if [ "$fail" = 1 ]; then tail -n 40 "$tmp/out4"; fi
}

run_to_the_end
interrupted 2 shell
interrupted 3 group
imagenet
[ "$fail" = 0 ] && say "ok: no process left behind in 4 runs"
exit "$fail"
