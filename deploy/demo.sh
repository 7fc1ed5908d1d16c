#!/usr/bin/env bash
# Ferry's main job on one machine, from a fresh Debian 12 machine: installs
# what it needs, builds, generates a synthetic dataset, measures the seed
# pipeline stage by stage, then starts a local cluster (a dispatcher and two
# workers on 127.0.0.1), runs a trainer through 2 epochs of
#   decode(raw, 32, 32, 3) | dilate(3) | blur(11, 0.8) | batch(1024)
# and shuts everything down.
#
#   FERRY_DEMO_DIR=DIR          where the dataset and logs go (/tmp/ferry-demo)
#   FERRY_DEMO_RECORDS=N        dataset size (100000)
set -euo pipefail

root=$(cd "$(dirname "$0")/.." && pwd)
build=${FERRY_BUILD_DIR:-$root/build-release}
demo=${FERRY_DEMO_DIR:-/tmp/ferry-demo}
data=$demo/data
records=${FERRY_DEMO_RECORDS:-100000}

"$root/deploy/install-deps.sh"
cmake -S "$root" -B "$build" -DCMAKE_BUILD_TYPE=Release >/dev/null
cmake --build "$build" -j "$(nproc)" --target ferryctl ferry-dispatcher \
  ferry-worker ferry-example-trainer
ferryctl=$build/client/ctl/ferryctl

echo "== generating $records 32x32x3 raw records in $data"
rm -rf "$demo"
mkdir -p "$demo"
"$ferryctl" gen --out "$data" --shards 4 --records "$records" \
  --format raw --size 32x32 --seed 7
"$ferryctl" records inspect "$data/train-00000-of-00004.tfrecord"

echo
echo "== the seed pipeline in one process, stage by stage"
"$ferryctl" bench pipeline --quick

echo
echo "== a local cluster: a dispatcher and 2 workers on 127.0.0.1"
pids=()
cleanup() {
  for p in "${pids[@]}"; do kill -TERM "$p" 2>/dev/null || true; done
  for p in "${pids[@]}"; do wait "$p" 2>/dev/null || true; done
}
trap cleanup EXIT

# start NAME LOG CMD...: runs a daemon, waits (10 s at most) for its
# "listening on HOST:PORT" line and prints HOST:PORT.
start() {
  local name=$1 log=$2
  shift 2
  "$@" >"$log.out" 2>"$log.err" &
  pids+=($!)
  for _ in $(seq 100); do
    if grep -q "listening on" "$log.out" 2>/dev/null; then
      sed -n 's/.*listening on //p' "$log.out" | head -n 1
      return 0
    fi
    sleep 0.1
  done
  echo "$name did not start; its log:" >&2
  cat "$log.err" >&2
  return 1
}

dispatcher=$(start dispatcher "$demo/dispatcher" \
  "$build/dispatcher/ferry-dispatcher" --port 0 --host 127.0.0.1 \
  --work-dir "$demo/dispatcher-state")
echo "dispatcher at $dispatcher"
for i in 1 2; do
  w=$(start "worker $i" "$demo/worker$i" "$build/worker/ferry-worker" \
    --dispatcher "$dispatcher" --port 0 --host 127.0.0.1 --threads 1)
  echo "worker $i at $w"
done

spec="tfrecord(\"$data/train-*.tfrecord\") | decode(raw, 32, 32, 3) | dilate(3) | blur(11, 0.8) | batch(1024)"
echo
echo "== trainer: 2 epochs of $spec"
"$build/client/examples/ferry-example-trainer" --dispatcher "$dispatcher" \
  --spec "$spec" --epochs 2 --job-name demo
echo "(this trainer does no work per batch, so it spends its time waiting;"
echo " tests/bench/trainer measures the stall with a simulated training step)"

echo
echo "== cluster status"
"$ferryctl" status --dispatcher "$dispatcher" || true

echo
echo "== shutting down"
cleanup
pids=()
echo "all daemons exited; logs in $demo"
