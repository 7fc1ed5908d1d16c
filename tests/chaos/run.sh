#!/usr/bin/env bash
# Chaos on a schedule (issue 12, point 3): runs ferry_chaos (chaos.c) and
# makes sure nothing it started is left running.
#
#   tests/chaos/run.sh [--schedules N] [--seed S] [--epochs E]
#                      [--keep-going] [--verbose] [--build DIR]
#
# Schedules use seeds S, S+1, ... (without --seed, one drawn from the
# clock and printed); a failure names its seed, and
# `run.sh --seed S --schedules 1 --verbose` replays it (FERRY_IT_KEEP=1
# keeps the daemons' logs). The whole run is bounded: 120 s per schedule
# (a schedule takes about 5 s). The harness notes the pid of every process
# it starts in /tmp/ferry-it-pids-<its parent's pid>; after the driver
# exits (also when killed by the bound) every one still running is killed,
# and any found is a failure. FERRY_IT_DISPATCHER, FERRY_IT_WORKER and
# FERRY_IT_CLIENT name other binaries (a soak runs copies, so that a
# rebuild meanwhile does not change them under it).
set -uo pipefail

root=$(cd "$(dirname "$0")/../.." && pwd)
build=${FERRY_BUILD_DIR:-$root/build}
args=()
schedules=20
while [ $# -gt 0 ]; do
  case $1 in
    --build) build=$2; shift 2 ;;
    --schedules) schedules=$2; args+=("$1" "$2"); shift 2 ;;
    --seed|--epochs) args+=("$1" "$2"); shift 2 ;;
    --keep-going|--verbose) args+=("$1"); shift ;;
    -h|--help) sed -n '2,15p' "$0"; exit 0 ;;
    *) echo "run.sh: unknown argument '$1' (--help)" >&2; exit 2 ;;
  esac
done
case $schedules in
  ''|*[!0-9]*) echo "run.sh: --schedules needs a number, got '$schedules'" >&2
               exit 2 ;;
esac
driver=$build/tests/chaos/ferry_chaos
if [ ! -x "$driver" ]; then
  echo "run.sh: no $driver (build first: cmake --build $build)" >&2
  exit 2
fi

start=$(date +%s)
# The driver's parent is `timeout`: the pid file is named after it.
timeout -k 10 $((120 * schedules + 60)) "$driver" "${args[@]}" &
tpid=$!
pids=/tmp/ferry-it-pids-$tpid
trap 'kill -TERM $tpid 2>/dev/null' INT TERM
wait $tpid
rc=$?
trap - INT TERM
[ $rc -ne 124 ] && [ $rc -ne 137 ] ||
  echo "run.sh: ferry_chaos ran past its bound ($((120 * schedules + 60)) s)" >&2

left=0
if [ -f "$pids" ]; then
  while read -r pid; do
    cmd=$( { tr "\\0" " " < "/proc/$pid/cmdline"; } 2>/dev/null) || continue
    case $cmd in
      *ferry-dispatcher*|*ferry-worker*|*it_client*)
        echo "run.sh: process $pid left running: $cmd" >&2
        kill -9 "$pid" 2>/dev/null
        left=$((left + 1)) ;;
    esac
  done < "$pids"
  rm -f "$pids"
fi
echo "run.sh: exit $rc, $left processes left, $(( $(date +%s) - start )) s"
[ $rc -eq 0 ] && [ $left -eq 0 ]
