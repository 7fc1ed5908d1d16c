# shellcheck shell=bash disable=SC2034  # sets variables its includers use
# Shared by metrics.sh and metrics_prometheus.sh (sourced, not run): the
# skip check, a temp dir and the processes that are always stopped, and a
# local cluster (dispatcher + worker) serving metrics on ports it picks.
#
#   need TOOL...                exit 77 (skip) naming the first one missing
#   start_cluster BUILD RECORDS SEED
#                               generates RECORDS raw 16x16x3 records in
#                               $tmp/data and starts the daemons; sets
#                               disp (HOST:PORT of the dispatcher), dm and
#                               wm (HOST:PORT of their metrics servers)
#   track PID                   stopped (TERM, then KILL after 10 s) at exit
#   wait_line FILE REGEX        the first matching line (10 s at most)
#   fail MSG                    exit 1

need() {
  local tool
  for tool in "$@"; do
    if ! command -v "$tool" >/dev/null; then
      echo "SKIP: $tool is not installed (deploy/install-deps.sh installs it)"
      exit 77
    fi
  done
}

tmp=$(mktemp -d)
pids=()
cleanup() {
  local p
  for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done
  for p in "${pids[@]}"; do
    for _ in $(seq 200); do kill -0 "$p" 2>/dev/null || break; sleep 0.05; done
    kill -9 "$p" 2>/dev/null || true
  done
  rm -rf "$tmp"
}
trap cleanup EXIT
track() { pids+=("$1"); }
fail() { echo "FAIL: $*" >&2; exit 1; }

wait_line() {
  for _ in $(seq 200); do
    if grep -qE "$2" "$1" 2>/dev/null; then grep -E "$2" "$1" | head -n 1; return 0; fi
    sleep 0.05
  done
  cat "$1" "${1%.out}.err" >&2 || true
  fail "no line matching '$2' in $1"
}

start_cluster() {
  local build=$1 records=$2 seed=$3
  "$build/client/ctl/ferryctl" gen --out "$tmp/data" --shards 2 \
    --records "$records" --format raw --size 16x16 --seed "$seed" >/dev/null
  "$build/dispatcher/ferry-dispatcher" --port 0 --host 127.0.0.1 \
    --work-dir "$tmp/state" --metrics-port 0 >"$tmp/d.out" 2>"$tmp/d.err" &
  track $!
  disp=$(wait_line "$tmp/d.out" "listening on" | sed 's/.*listening on //')
  dm=$(wait_line "$tmp/d.out" "metrics on http://" |
       sed 's|.*metrics on http://||; s|/metrics$||')
  "$build/worker/ferry-worker" --dispatcher "$disp" --port 0 --host 127.0.0.1 \
    --threads 2 --metrics-port 0 >"$tmp/w.out" 2>"$tmp/w.err" &
  track $!
  wait_line "$tmp/w.out" "listening on" >/dev/null
  wm=$(wait_line "$tmp/w.out" "metrics on http://" |
       sed 's|.*metrics on http://||; s|/metrics$||')
}
