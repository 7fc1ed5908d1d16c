#!/usr/bin/env bash
# Chaos on a schedule: runs ferry_chaos (chaos.c) and
# makes sure nothing it started is left running.
#
#   tests/chaos/run.sh [--schedules N] [--seed S] [--epochs E]
#                      [--keep-going] [--verbose] [--build DIR]
#                      [--replay-failures] [--partition-rounds R]
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
# rebuild meanwhile does not change them under it). --replay-failures (the
# ctest run) replays each failed seed once and fails only if the replay
# fails too, printing both.
#
# --partition-rounds R (the soak's network half): after the
# schedules, every case of integration/partitions R times on gRPC and R
# times on UCX (held to TCP), each round with fresh random fault points
# (each case prints its seed; FERRY_IT_SEED replays one), each bounded
# by 600 s; then no network namespace of theirs and no process they
# started may be left. Needs root, ip and iptables (skips, saying so).
set -uo pipefail

root=$(cd "$(dirname "$0")/../.." && pwd)
build=${FERRY_BUILD_DIR:-$root/build}
args=()
schedules=20
replay=0
partition_rounds=0
while [ $# -gt 0 ]; do
  case $1 in
    --build) build=$2; shift 2 ;;
    --schedules) schedules=$2; args+=("$1" "$2"); shift 2 ;;
    --seed|--epochs) args+=("$1" "$2"); shift 2 ;;
    --keep-going|--verbose) args+=("$1"); shift ;;
    --replay-failures) replay=1; args+=(--keep-going); shift ;;
    --partition-rounds) partition_rounds=$2; shift 2 ;;
    -h|--help) sed -n '2,20p' "$0"; exit 0 ;;
    *) echo "run.sh: unknown argument '$1' (--help)" >&2; exit 2 ;;
  esac
done
for n in "$schedules" "$partition_rounds"; do
  case $n in
    ''|*[!0-9]*) echo "run.sh: --schedules and --partition-rounds need a" \
                   "number, got '$n'" >&2
                 exit 2 ;;
  esac
done
driver=$build/tests/chaos/ferry_chaos
if [ ! -x "$driver" ]; then
  echo "run.sh: no $driver (build first: cmake --build $build)" >&2
  exit 2
fi

start=$(date +%s)
out=$(mktemp)
trap 'rm -f "$out"' EXIT

# Runs the driver with "$@" (N schedules: its bound is 120 s each plus 60),
# sets rc and left (processes it started still running, killed here).
run_driver() {
  local n=$1
  shift
  # The driver's parent is `timeout`: the pid file is named after it.
  local before
  before=$(wc -l < "$out")
  if [ "$replay" = 1 ]; then
    timeout -k 10 $((120 * n + 60)) "$driver" "$@" >> "$out" &
  else
    timeout -k 10 $((120 * n + 60)) "$driver" "$@" &
  fi
  local tpid=$!
  local pids=/tmp/ferry-it-pids-$tpid
  trap 'kill -TERM $tpid 2>/dev/null' INT TERM
  wait $tpid
  rc=$?
  trap - INT TERM
  [ "$replay" = 1 ] && tail -n +$((before + 1)) "$out"
  [ $rc -ne 124 ] && [ $rc -ne 137 ] ||
    echo "run.sh: ferry_chaos ran past its bound ($((120 * n + 60)) s)" >&2
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
}

rc=0
left=0
[ "$schedules" -eq 0 ] || run_driver "$schedules" "${args[@]}"
if [ "$replay" = 1 ] && [ $rc -eq 1 ] && [ $left -eq 0 ]; then
  # --replay-failures (the CI run): each failed seed runs once more, and
  # the run fails only if a replay fails too. Both results are printed;
  # a seed that passes its replay is reported as flaky. The soak
  # (without this flag) counts every failure.
  seeds=$(sed -n 's/^chaos: .* failed (seeds: \(.*\)),.*/\1/p' "$out" | tail -n 1)
  flaky=""
  for s in $seeds; do
    run_driver 1 --seed "$s" --schedules 1 --verbose
    if [ $rc -ne 0 ] || [ $left -ne 0 ]; then
      echo "run.sh: seed $s failed again when replayed" >&2
      break
    fi
    flaky="$flaky $s"
  done
  if [ -n "$seeds" ] && [ $rc -eq 0 ] && [ $left -eq 0 ]; then
    echo "run.sh: FLAKY: seed(s)$flaky failed, then passed when replayed" \
      "(an open, intermittent starvation after a dispatcher restart:" \
      "docs/PERFORMANCE.md, the chaos soak); not counted as a failure here"
  elif [ -z "$seeds" ]; then
    rc=1
  fi
fi
# The partition rounds: test_partitions names its namespaces fy<its pid>
# and its processes run inside them (`ip netns pids` finds them).
partition_failures=0
partition_runs=0
if [ "$partition_rounds" -gt 0 ]; then
  parts=$build/tests/integration/test_partitions
  if [ ! -x "$parts" ]; then
    echo "run.sh: no $parts (build first)" >&2
    exit 2
  fi
  for round in $(seq 1 "$partition_rounds"); do
    for tr in grpc ucx; do
      log=$(mktemp)
      FERRY_TRANSPORT=$tr FERRY_IT_CLIENT_TRANSPORT=$tr \
        timeout -k 10 600 "$parts" --jobs 1 > "$log" 2>&1 &
      ppid_=$!
      wait $ppid_
      prc=$?
      partition_runs=$((partition_runs + 1))
      if grep -q "SKIP: no network namespaces" "$log"; then
        grep -m1 "SKIP: no network namespaces" "$log"
        rm -f "$log"
        break 2
      fi
      for ns in $(ip netns list 2>/dev/null | awk '{print $1}' |
                  grep "^fy$ppid_"); do
        for pid in $(ip netns pids "$ns" 2>/dev/null); do
          echo "run.sh: process $pid left running in $ns" >&2
          kill -9 "$pid" 2>/dev/null
          left=$((left + 1))
        done
        echo "run.sh: network namespace $ns left behind" >&2
        ip netns del "$ns"
        left=$((left + 1))
      done
      if [ $prc -ne 0 ]; then
        partition_failures=$((partition_failures + 1))
        echo "run.sh: partitions round $round on $tr failed (exit $prc):"
        grep -E "seed|Assertion|FAIL|bound|^\[----\]   " "$log" | head -40
      else
        grep -E "^\[====\] Synthesis" "$log" |
          sed "s/^/run.sh: partitions round $round on $tr: /"
      fi
      rm -f "$log"
    done
  done
  echo "run.sh: $partition_runs partition runs, $partition_failures failed"
  [ $partition_failures -eq 0 ] || rc=1
fi
echo "run.sh: exit $rc, $left processes left, $(( $(date +%s) - start )) s"
[ $rc -eq 0 ] && [ $left -eq 0 ]
