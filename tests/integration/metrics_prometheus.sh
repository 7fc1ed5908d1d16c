#!/usr/bin/env bash
# A real Prometheus server (Debian's prometheus) scrapes
# a local cluster's dispatcher and worker every second; after an epoch,
# ferry_worker_records_total read back through its HTTP query API must
# equal what the worker's /metrics reports, and both targets must be up.
# Usage: metrics_prometheus.sh BUILD_DIR. Exit 77 (skip) without
# prometheus or curl.
set -euo pipefail
build=${1:?usage: metrics_prometheus.sh BUILD_DIR}
prom=$(command -v prometheus || true)
[ -n "$prom" ] || [ ! -x /usr/bin/prometheus ] || prom=/usr/bin/prometheus
# shellcheck source-path=SCRIPTDIR source=metrics_lib.sh
. "$(dirname "$0")/metrics_lib.sh"
[ -n "$prom" ] || need prometheus
need curl python3
start_cluster "$build" 2000 5

cat >"$tmp/prometheus.yml" <<YML
global:
  scrape_interval: 1s
  scrape_timeout: 900ms
scrape_configs:
  - job_name: ferry
    static_configs:
      - targets: ['$dm', '$wm']
YML
# Prometheus cannot listen on port 0: take a free port and retry on a race.
started=0
for attempt in 1 2 3 4 5; do
  port=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
  "$prom" --config.file="$tmp/prometheus.yml" \
    --storage.tsdb.path="$tmp/tsdb.$attempt" \
    --web.listen-address="127.0.0.1:$port" >"$tmp/p.log" 2>&1 &
  ppid=$!
  for _ in $(seq 100); do
    if curl -sf "http://127.0.0.1:$port/-/ready" >/dev/null; then started=1; break; fi
    kill -0 $ppid 2>/dev/null || break
    sleep 0.1
  done
  if [ $started = 1 ]; then track $ppid; break; fi
  kill $ppid 2>/dev/null || true; wait $ppid 2>/dev/null || true
done
[ $started = 1 ] || { cat "$tmp/p.log"; fail "prometheus did not start"; }

spec="tfrecord(\"$tmp/data/train-*.tfrecord\") | decode(raw, 16, 16, 3) | batch(100)"
"$build/client/examples/ferry-example-trainer" --dispatcher "$disp" \
  --spec "$spec" --epochs 1 --job-name prom >"$tmp/t.out" 2>&1 ||
  { cat "$tmp/t.out"; fail "trainer"; }
want=$(curl -sf "http://$wm/metrics" | awk '$1 == "ferry_worker_records_total" { print $2 }')
[ "$want" = 2000 ] || fail "the worker reports $want records, not 2000"

query() {
  curl -sf "http://127.0.0.1:$port/api/v1/query" --data-urlencode "query=$1" |
    python3 -c 'import json,sys; r=json.load(sys.stdin)["data"]["result"]; print(" ".join(x["value"][1] for x in r))'
}
# Scrapes every second for ~20 s at most until the value arrives.
got=""
for _ in $(seq 40); do
  got=$(query 'sum(ferry_worker_records_total)' || true)
  [ "$got" = "$want" ] && break
  sleep 0.5
done
[ "$got" = "$want" ] || fail "Prometheus has ferry_worker_records_total '$got', the worker $want"
# Both targets up (a scrape can time out on a loaded machine: poll).
up=""
for _ in $(seq 40); do
  up=$(query 'sum(up{job="ferry"})' || true)
  [ "$up" = 2 ] && break
  sleep 0.5
done
[ "$up" = 2 ] || fail "up{job=ferry} sums to '$up', not 2 (both targets up)"
echo "PASS: Prometheus read ferry_worker_records_total = $got back"
