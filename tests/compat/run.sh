#!/usr/bin/env bash
# The wire against the previous release (tests/compat/PREVIOUS_RELEASE):
# a client and a worker of that release still run a job to the end with
# this tree's dispatcher, every record exactly once per epoch.
#
# Extracts the release with git archive and builds only its ferry-worker
# and it_client (tests/integration/it_client.c, a trainer process that
# writes every record id it is handed), builds (or takes, --new-build)
# this tree's ferry-dispatcher, ferry-worker, ferryctl and it_client, then
# on 127.0.0.1, ports 0, starts
#   this tree's dispatcher, one worker of the release, one of this tree,
# writes a dataset with `ferryctl gen` (4 shards of 600 records, 100
# records per split: 24 splits per epoch, spread over both workers) and
# runs two jobs of EPOCHS epochs one after the other:
#   the release's it_client   (old client: old worker and new worker)
#   this tree's it_client     (new client: old worker and new worker)
# Each passes when the client exits 0, every epoch holds every record id
# exactly once, and each worker produced records for it (its
# ferry_worker_records_total grew). The clients use the transport
# `auto`: UCX where the worker publishes an address the client can use,
# else gRPC. At the end the daemons must exit 0 on SIGTERM.
#
#   tests/compat/run.sh [--new-build DIR] [--work DIR] [--epochs N]
#
#   --new-build DIR  a configured and built tree of this source (ctest
#                    passes its own); default: WORK/new, built here
#   --work DIR       where the release is extracted and built
#                    (WORK/release, reused while the hash is the same) and
#                    the new tree built; default ./build-compat
#   --epochs N       epochs per job (2)
#   FERRY_COMPAT_JOBS=N   build parallelism (default: nproc)
#   FERRY_COMPAT_KEEP=1   keep the cluster's logs and data (path printed)
#
# Prints what it checked; exits 1 on a failure, 0 with "SKIP: why" when
# the release cannot be extracted (no git, not a checkout, a shallow
# clone without the commit). Every wait is bounded and every process it
# started is stopped on any exit.
set -euo pipefail

root=$(cd "$(dirname "$0")/../.." && pwd)
work=$root/build-compat
new_build=
epochs=2
jobs=${FERRY_COMPAT_JOBS:-$(nproc)}
while [ $# -gt 0 ]; do
  case $1 in
    --new-build) new_build=$2; shift 2 ;;
    --work) work=$2; shift 2 ;;
    --epochs) epochs=$2; shift 2 ;;
    -h|--help) sed -n '2,/^set -euo/p' "$0" | sed '$d; s/^# \{0,1\}//'; exit 0 ;;
    *) echo "usage: tests/compat/run.sh [--new-build DIR] [--work DIR]" \
         "[--epochs N]" >&2; exit 2 ;;
  esac
done
start=$(date +%s)
elapsed() { echo "$(( $(date +%s) - start )) s"; }

# shellcheck source=tests/compat/release.sh
. "$root/tests/compat/release.sh"
rc=0
release_commit || rc=$?
if [ "$rc" = 1 ]; then exit 0; fi # SKIP: printed
if [ "$rc" != 0 ]; then exit "$rc"; fi
echo "== previous release: $release ($(git -C "$root" log -1 \
  --format='%cs %s' "$release"))"

echo "== building the release's ferry-worker and it_client in $work/release"
t0=$(date +%s)
release_build "$work/release" RelWithDebInfo ferry-worker it_client
echo "   built in $(( $(date +%s) - t0 )) s"
old=$work/release/build
if [ -z "$new_build" ]; then
  echo "== building this tree's daemons, ferryctl and it_client in $work/new"
  t0=$(date +%s)
  tree_build "$root" "$work/new" RelWithDebInfo ferry-dispatcher \
    ferry-worker ferryctl it_client
  echo "   built in $(( $(date +%s) - t0 )) s"
  new_build=$work/new/build
fi
new=$(cd "$new_build" && pwd)

old_worker=$old/worker/ferry-worker
old_client=$old/tests/integration/it_client
new_dispatcher=$new/dispatcher/ferry-dispatcher
new_worker=$new/worker/ferry-worker
new_client=$new/tests/integration/it_client
ferryctl=$new/client/ctl/ferryctl
for b in "$old_worker" "$old_client" "$new_dispatcher" "$new_worker" \
         "$new_client" "$ferryctl"; do
  if [ ! -x "$b" ]; then
    echo "FAIL: $b is not built" >&2
    exit 1
  fi
done
check=$root/tests/compat/check.py
# The clients' transport is `auto` (their default), whatever the caller's
# environment says.
unset FERRY_TRANSPORT FERRY_IT_CLIENT_TRANSPORT

tmp=$(mktemp -d "${TMPDIR:-/tmp}/ferry-compat.XXXXXX")
pids=()
names=()
logs=()
stopped=0

alive() {
  local st
  st=$(cat "/proc/$1/stat" 2>/dev/null) || return 1
  st=${st##*) }
  [ "${st:0:1}" != Z ]
}

# stop_all: SIGTERM to each daemon started, the last started first (the
# workers before their dispatcher), up to 10 s for each to exit, then
# SIGKILL. Sets $stop_failed to what did not exit 0 in time.
stop_all() {
  local i st
  stop_failed=
  [ "$stopped" = 0 ] || return 0
  stopped=1
  for (( i = ${#pids[@]} - 1; i >= 0; i-- )); do
    kill -TERM "${pids[$i]}" 2>/dev/null || true
    for _ in $(seq 100); do alive "${pids[$i]}" || break; sleep 0.1; done
    if alive "${pids[$i]}"; then
      kill -KILL "${pids[$i]}" 2>/dev/null || true
      stop_failed+=" ${names[$i]} (ignored SIGTERM for 10 s: killed)"
    fi
    st=0
    wait "${pids[$i]}" 2>/dev/null || st=$?
    if [ "$st" != 0 ]; then stop_failed+=" ${names[$i]} (exit $st)"; fi
  done
}

dump_logs() {
  local l
  for l in "${logs[@]}"; do
    [ -s "$l" ] || continue
    echo "---- last lines of $l" >&2
    tail -n 25 "$l" >&2
  done
}

finish() {
  local rc=$?
  trap - EXIT INT TERM
  stop_all
  if [ "$rc" != 0 ]; then dump_logs; fi
  if [ "${FERRY_COMPAT_KEEP:-0}" = 1 ]; then
    echo "logs and data kept in $tmp"
  else
    rm -rf "$tmp"
  fi
  exit "$rc"
}
trap finish EXIT
trap 'exit 130' INT
trap 'exit 143' TERM

fail() {
  echo "FAIL: $*" >&2
  exit 1
}

# wait_line FILE PATTERN PID: up to 10 s for a line of FILE matching
# PATTERN while PID lives; prints what follows PATTERN on it.
wait_line() {
  local line
  for _ in $(seq 100); do
    line=$(grep -m1 -- "$2" "$1" 2>/dev/null || true)
    if [ -n "$line" ]; then
      echo "${line#*"$2"}"
      return 0
    fi
    alive "$3" || break
    sleep 0.1
  done
  return 1
}

# start NAME CMD...: starts a daemon, waits for its "listening on" line
# and sets $addr.
start() {
  local name=$1
  shift
  "$@" >"$tmp/$name.out" 2>"$tmp/$name.log" &
  pids+=("$!")
  names+=("$name")
  logs+=("$tmp/$name.log")
  addr=$(wait_line "$tmp/$name.out" "listening on " "$!") ||
    fail "$name did not say 'listening on' within 10 s"
}

# metrics_url NAME: sets $url to where worker NAME (the last started,
# with --metrics-port 0) serves /metrics.
metrics_url() {
  url=$(wait_line "$tmp/$1.out" "metrics on " "${pids[-1]}") ||
    fail "$1 did not say 'metrics on' within 10 s"
}

# alive_workers: how many workers the dispatcher lists as alive.
alive_workers() {
  "$ferryctl" status --dispatcher "$dispatcher" --json \
    >"$tmp/status.json" 2>>"$tmp/ferryctl.log" || { echo 0; return; }
  python3 "$check" alive "$tmp/status.json" || echo 0
}

records_total() {
  python3 "$check" metric "$1" ferry_worker_records_total ||
    fail "cannot read ferry_worker_records_total from $1"
}

echo "== a cluster on 127.0.0.1 in $tmp"
start dispatcher "$new_dispatcher" --port 0 --host 127.0.0.1 \
  --work-dir "$tmp/dispatcher-state" --heartbeat-ms 100 \
  --records-per-split 100
dispatcher=$addr
echo "   dispatcher (this tree)      $dispatcher"
worker_flags=(--dispatcher "$dispatcher" --port 0 --host 127.0.0.1
  --threads 1 --heartbeat-ms 100 --metrics-port 0)
start old-worker "$old_worker" "${worker_flags[@]}"
old_worker_addr=$addr
metrics_url old-worker
old_metrics=$url
echo "   worker (previous release)   $old_worker_addr"
start new-worker "$new_worker" "${worker_flags[@]}"
new_worker_addr=$addr
metrics_url new-worker
new_metrics=$url
echo "   worker (this tree)          $new_worker_addr"
n=0
for _ in $(seq 100); do
  n=$(alive_workers)
  [ "$n" != 2 ] || break
  sleep 0.2
done
[ "$n" = 2 ] || fail "the dispatcher lists $n workers alive after 20 s, not 2"
echo "   both workers alive in ferryctl status"

shards=4
per_shard=600
"$ferryctl" gen --out "$tmp/data" --shards "$shards" \
  --records $((shards * per_shard)) --format raw --size 8x8 --seed 7 \
  >"$tmp/gen.log" 2>&1 || fail "ferryctl gen failed: $(cat "$tmp/gen.log")"
spec="tfrecord(\"$tmp/data/train-*.tfrecord\") | decode(raw, 8, 8, 3) | batch(64)"
echo "   data: $shards shards x $per_shard records (ferryctl gen), 100 per split"

# run_job NAME WHAT CLIENT: one named job of $epochs epochs with CLIENT
# (an it_client), checked.
run_job() {
  local job=$1 what=$2 client=$3 o0 n0 o1 n1 st=0
  echo
  echo "== job $job: $what, $epochs epochs"
  o0=$(records_total "$old_metrics")
  n0=$(records_total "$new_metrics")
  logs+=("$tmp/$job.log")
  # Bounded: the job takes well under a second here.
  timeout -k 5 120 "$client" "$dispatcher" "$spec" "$job" "$epochs" \
    "$tmp/$job.bin" 0 -1 >"$tmp/$job.out" 2>"$tmp/$job.log" || st=$?
  [ "$st" != 124 ] || fail "$job: the client did not finish within 120 s"
  [ "$st" = 0 ] || fail "$job: the client exited $st: $(tail -n 3 "$tmp/$job.log")"
  python3 "$check" ids "$tmp/$job.bin" "$epochs" "$shards" "$per_shard" ||
    fail "$job: records not delivered exactly once"
  o1=$(records_total "$old_metrics")
  n1=$(records_total "$new_metrics")
  echo "  produced: $((o1 - o0)) records by the release's worker," \
    "$((n1 - n0)) by this tree's"
  [ $((o1 - o0)) -gt 0 ] || fail "$job: the release's worker served nothing"
  [ $((n1 - n0)) -gt 0 ] || fail "$job: this tree's worker served nothing"
  sed -n 's/.*client: \(worker .*: transport .*\)/  the client said: \1/p' \
    "$tmp/$job.log"
}

run_job compat-old-client \
  "the release's it_client, the release's worker and this tree's" \
  "$old_client"
run_job compat-new-client \
  "this tree's it_client, the release's worker and this tree's" \
  "$new_client"

echo
n=$(alive_workers)
[ "$n" = 2 ] || fail "after the jobs the dispatcher lists $n workers alive, not 2"
for i in "${!pids[@]}"; do
  alive "${pids[$i]}" || fail "${names[$i]} died during the jobs"
done
stop_all
[ -z "$stop_failed" ] || fail "stopping with SIGTERM:$stop_failed"
echo "== the dispatcher and both workers exited 0 on SIGTERM"
echo "compat: PASS against the previous release ${release:0:12}" \
  "(old client + old and new workers, new client + old and new workers," \
  "new dispatcher; $epochs epochs each, every record once) in $(elapsed)"
