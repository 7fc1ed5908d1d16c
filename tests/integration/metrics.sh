#!/usr/bin/env bash
# A local cluster (dispatcher + worker, --metrics-port 0)
# runs one epoch through ferry-example-trainer; both /metrics are scraped,
# `promtool check metrics` must accept each, the worker's
# ferry_worker_records_total and the dispatcher's
# ferry_job_records_delivered_total must equal `ferryctl status --json`'s
# delivered_all, /healthz and /readyz answer 200 and another path 404.
# Usage: metrics.sh BUILD_DIR. Exit 77 (skip) without promtool or curl.
set -euo pipefail
build=${1:?usage: metrics.sh BUILD_DIR}
# shellcheck source-path=SCRIPTDIR source=metrics_lib.sh
. "$(dirname "$0")/metrics_lib.sh"
need promtool curl python3
start_cluster "$build" 3000 3
wbase=http://$wm
dbase=http://$dm

code() { curl -s -o /dev/null -w '%{http_code}' "$@"; }
[ "$(code "$dbase/healthz")" = 200 ] || fail "dispatcher /healthz"
[ "$(code "$dbase/readyz")" = 200 ] || fail "dispatcher /readyz"
[ "$(code "$wbase/healthz")" = 200 ] || fail "worker /healthz"
[ "$(code "$dbase/nothing")" = 404 ] || fail "dispatcher /nothing is not 404"
[ "$(code -X POST "$wbase/metrics")" = 405 ] || fail "POST /metrics is not 405"
[ "$(code -I "$wbase/metrics")" = 200 ] || fail "HEAD /metrics"
# The worker is ready once registered (its first heartbeat): bounded poll.
for _ in $(seq 100); do
  [ "$(code "$wbase/readyz")" = 200 ] && break
  sleep 0.1
done
[ "$(code "$wbase/readyz")" = 200 ] || fail "worker /readyz never 200"

spec="tfrecord(\"$tmp/data/train-*.tfrecord\") | decode(raw, 16, 16, 3) | dilate(3) | batch(100)"
"$build/client/examples/ferry-example-trainer" --dispatcher "$disp" \
  --spec "$spec" --epochs 1 --job-name metrics >"$tmp/t.out" 2>&1 ||
  { cat "$tmp/t.out"; fail "trainer"; }

status=$("$build/client/ctl/ferryctl" status --dispatcher "$disp" --json | head -n 1)
want=$(python3 -c 'import json,sys; d=json.loads(sys.argv[1]); print(sum(j.get("delivered_all", 0) for j in d["jobs"]))' "$status")
[ "$want" = 3000 ] || fail "ferryctl status --json: delivered_all $want, not 3000"

# sum NAME FILE: the sum of a metric's samples.
sum() { awk -v n="$1" '$1 == n || index($1, n "{") == 1 { s += $NF } END { printf "%d", s }' "$2"; }
# The worker counts records when a chunk is handed on, the client acks
# later: poll (bounded) until both sides agree with ferryctl.
for _ in $(seq 50); do
  curl -sf "$wbase/metrics" >"$tmp/w.prom"
  curl -sf "$dbase/metrics" >"$tmp/d.prom"
  [ "$(sum ferry_worker_records_total "$tmp/w.prom")" = "$want" ] &&
    [ "$(sum ferry_job_records_delivered_total "$tmp/d.prom")" = "$want" ] && break
  sleep 0.1
done
promtool check metrics <"$tmp/w.prom" || fail "promtool rejects the worker's metrics"
promtool check metrics <"$tmp/d.prom" || fail "promtool rejects the dispatcher's metrics"
got=$(sum ferry_worker_records_total "$tmp/w.prom")
[ "$got" = "$want" ] || fail "ferry_worker_records_total $got != ferryctl's $want"
got=$(sum ferry_job_records_delivered_total "$tmp/d.prom")
[ "$got" = "$want" ] || fail "ferry_job_records_delivered_total $got != $want"
grep -q '^ferry_worker_stage_seconds_count{stage="decode"} [1-9]' "$tmp/w.prom" ||
  fail "no decode stage timings"
grep -q '^ferry_dispatcher_leases_granted_total [1-9]' "$tmp/d.prom" ||
  fail "no leases counted"
grep -q '^ferry_job_workers_wanted{job="[0-9]*",name="metrics"} [1-9]' "$tmp/d.prom" ||
  fail "no workers-wanted gauge for job 'metrics'"
grep -q '^ferry_rpc_handled_total{method="/ferry.v1.Dispatcher/WorkerHeartbeat",code="OK"} [1-9]' "$tmp/d.prom" ||
  fail "no WorkerHeartbeat RPCs counted"
echo "PASS: metrics ($want records; promtool ok on both daemons)"
