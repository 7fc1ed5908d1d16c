#!/usr/bin/env bash
# Ferry's main job on one machine, from a fresh Debian 12 machine: installs
# what it needs, builds, generates a synthetic dataset, measures the seed
# pipeline stage by stage, then starts a local cluster (a dispatcher and two
# workers on 127.0.0.1), runs a trainer through 2 epochs of
#   decode(raw, 32, 32, 3) | dilate(3) | blur(11, 0.8) | batch(1024)
# and shuts everything down. Whatever happens (success, a failed step,
# Ctrl-C, SIGTERM), every process it started is stopped before it exits,
# and it says whether they are all gone.
#
#   deploy/demo.sh --imagenet   an ImageNet-like job instead:
#     photo-like JPEGs in ImageNet's sizes (mostly 375x500, about 0.6 bytes
#     per pixel at quality 90); the workers decode each with
#       decode(jpeg) | random_resized_crop(224) | batch(256)
#     (the decode fused with the crop and the DCT scale); the trainer stages
#     224x224 batches and flips them (on the GPU when one is usable, else
#     on the CPU), sleeps FERRY_DEMO_STEP_MS per batch in place of a
#     training step, and prints images/s and the stall fraction. The job
#     reads the dataset as `ferryctl records optimize` rewrites it
#     (restart-interval tiles: the decode entropy-decodes only the tiles
#     that cover each crop, the same pixels); FERRY_DEMO_OPTIMIZE=0 reads
#     the generated files as they are.
#
#   FERRY_DEMO_DIR=DIR          where the dataset and logs go (/tmp/ferry-demo);
#                               emptied at the start, and locked while the
#                               demo runs (DIR.lock): a second demo on
#                               the same directory refuses to start,
#                               naming the first's pid
#   FERRY_DEMO_RECORDS=N        dataset size (100000; --imagenet: 5000)
#   FERRY_DEMO_EPOCHS=N         epochs the trainer reads (2)
#   FERRY_DEMO_STEP_MS=X        --imagenet: the simulated step per batch of
#                               256 (100 ms: 2,560 images/s wanted)
#   FERRY_BUILD_DIR=DIR         build tree ($root/build-release)
#   FERRY_DEMO_NO_BUILD=1       use the binaries already in FERRY_BUILD_DIR
#                               (no package installation, no build)
#   FERRY_DEMO_SKIP_BENCH=1     skip the one-process pipeline measurement
#                               (--imagenet: bench_jpeg_crop on 500 of the
#                               JPEGs)
#   FERRY_DEMO_PIDFILE=FILE     append "PID NAME" for every process started
#                               (tests check that none is left)
#
# It installs only what building needs (install-deps.sh --demo: the
# build's packages and Criterion; no torch, podman or Prometheus) and builds what `cmake --install` of the
# build tree installs (the daemons, ferryctl, libferry) besides the
# demo's trainer and benchmark.
set -euo pipefail

imagenet=0
case "${1:-}" in
  "") ;;
  --imagenet) imagenet=1 ;;
  -h | --help)
    # The comment at the top: what it does and its settings.
    echo "usage: deploy/demo.sh [--imagenet]"
    sed -n '2,/^set -euo pipefail/{/^#/{s/^# \{0,1\}//;p}}' "$0"
    exit 0 ;;
  *) echo "usage: deploy/demo.sh [--imagenet] (--help: what it does, its" \
       "settings)" >&2; exit 2 ;;
esac

root=$(cd "$(dirname "$0")/.." && pwd)
build=${FERRY_BUILD_DIR:-$root/build-release}
demo=${FERRY_DEMO_DIR:-/tmp/ferry-demo}
demo=${demo%/}
data=$demo/data
if [ "$imagenet" = 1 ]; then
  records=${FERRY_DEMO_RECORDS:-5000}
else
  records=${FERRY_DEMO_RECORDS:-100000}
fi
step_ms=${FERRY_DEMO_STEP_MS:-100}
epochs=${FERRY_DEMO_EPOCHS:-2}
pidfile=${FERRY_DEMO_PIDFILE:-}

# ---- Every process this script starts in the background, and how they
# are stopped: on any exit (the EXIT trap also runs after INT and TERM).
pids=()
names=()
stopped=0

# alive PID: the process exists and is not a zombie waiting to be reaped.
alive() {
  local st
  st=$(cat "/proc/$1/stat" 2>/dev/null) || return 1
  st=${st##*) }
  [ "${st:0:1}" != Z ]
}

# stop_all: SIGTERM to everything started, up to 10 s for it to exit,
# SIGKILL to what is left, reap, then check with kill -0 that nothing
# remains. Returns 1 (and says which) if something does, and also when
# something needed the SIGKILL: every process here must exit on SIGTERM,
# so needing the fallback is a failure of the shutdown, said as one. A
# signal in the middle runs the traps, whose EXIT trap starts it over.
stop_all() {
  local p i left=() killed=() any
  [ "$stopped" = 0 ] || return 0
  [ "${#pids[@]}" -gt 0 ] || return 0
  echo "stopping ${#pids[@]} processes: ${names[*]}"
  for p in "${pids[@]}"; do kill -TERM "$p" 2>/dev/null || true; done
  for _ in $(seq 100); do
    any=0
    for p in "${pids[@]}"; do if alive "$p"; then any=1; fi; done
    [ "$any" = 1 ] || break
    sleep 0.1
  done
  for i in "${!pids[@]}"; do
    if alive "${pids[$i]}"; then
      echo "ERROR: ${names[$i]} (pid ${pids[$i]}) ignored SIGTERM for" \
        "10 s: SIGKILL" >&2
      killed+=("${names[$i]}")
      kill -KILL "${pids[$i]}" 2>/dev/null || true
    fi
  done
  for p in "${pids[@]}"; do wait "$p" 2>/dev/null || true; done
  for i in "${!pids[@]}"; do
    if kill -0 "${pids[$i]}" 2>/dev/null; then
      left+=("${names[$i]} (pid ${pids[$i]})")
    fi
  done
  if [ "${#left[@]}" -gt 0 ]; then
    echo "ERROR: still running after the shutdown: ${left[*]}" >&2
    return 1
  fi
  stopped=1
  echo "all ${#pids[@]} processes this demo started have exited" \
    "(pids ${pids[*]})"
  if [ "${#killed[@]}" -gt 0 ]; then
    echo "ERROR: the SIGKILL fallback was needed for ${killed[*]}: the" \
      "clean shutdown failed (logs in $demo)" >&2
    return 1
  fi
}

on_exit() {
  local rc=$?
  trap - EXIT INT TERM
  stop_all || rc=1
  exit "$rc"
}
trap on_exit EXIT
trap 'echo "interrupted" >&2; exit 130' INT
trap 'echo "terminated" >&2; exit 143' TERM

# track PID NAME: remember a background process (and note it in the pid
# file).
track() {
  pids+=("$1")
  names+=("$2")
  if [ -n "$pidfile" ]; then echo "$1 $2" >>"$pidfile"; fi
}

# One demo at a time per work directory: a second one would rm -rf the
# first's dataset and logs under it, and rebuild its build tree. The lock
# (on DIR.lock, beside it) is held until this shell and every process it
# started have exited.
mkdir -p "$(dirname "$demo")"
exec 7>>"$demo.lock"
if ! flock -n 7; then
  echo "deploy/demo.sh: another demo (pid $(cat "$demo.lock" 2>/dev/null || echo '?'))" \
    "is using $demo; wait for it to end, or give this one its own" \
    "FERRY_DEMO_DIR (and FERRY_BUILD_DIR)" >&2
  exit 1
fi
echo $$ >"$demo.lock"

if [ "${FERRY_DEMO_NO_BUILD:-0}" != 1 ]; then
  "$root/deploy/install-deps.sh" --demo
  cmake -S "$root" -B "$build" -DCMAKE_BUILD_TYPE=Release >/dev/null
  # The install set (ferry-dispatcher ferry-worker ferryctl ferry) too, so
  # that `cmake --install` of this tree works (README, "Running a cluster").
  cmake --build "$build" -j "$(nproc)" --target ferryctl ferry-dispatcher \
    ferry-worker ferry ferry-example-trainer bench_jpeg_crop
fi
ferryctl=$build/client/ctl/ferryctl

rm -rf "$demo"
mkdir -p "$demo"
if [ "$imagenet" = 1 ]; then
  echo "== generating $records ImageNet-like JPEGs (quality 90) in $data"
  "$ferryctl" gen --out "$data" --shards 4 --records "$records" \
    --format jpeg --content photo --size imagenet --quality 90 \
    --classes 1000 --seed 7
  if [ "${FERRY_DEMO_OPTIMIZE:-1}" != 0 ]; then
    echo "== rewriting their JPEGs with restart-interval tiles for cropping"
    "$ferryctl" records optimize "$data" "$demo/data-optimized"
    data=$demo/data-optimized
  fi
else
  echo "== generating $records 32x32x3 raw records in $data"
  "$ferryctl" gen --out "$data" --shards 4 --records "$records" \
    --format raw --size 32x32 --seed 7
  "$ferryctl" records inspect "$data/train-00000-of-00004.tfrecord"
fi

if [ "$imagenet" = 1 ] && [ "${FERRY_DEMO_SKIP_BENCH:-0}" != 1 ]; then
  echo
  echo "== the fused decode against the full decode, on one core (up to 500 of"
  echo "   the JPEGs, in memory)"
  "$build/tests/bench/bench_jpeg_crop" --data "$demo/data/train-*.tfrecord" \
    --records 500 --seconds 1 | grep -v '^RESULT'
fi
if [ "$imagenet" = 0 ] && [ "${FERRY_DEMO_SKIP_BENCH:-0}" != 1 ]; then
  echo
  echo "== the seed pipeline in one process, stage by stage"
  "$ferryctl" bench pipeline --quick
fi

echo
echo "== a local cluster: a dispatcher and 2 workers on 127.0.0.1"

# start NAME LOG CMD...: runs a daemon in the background (in this shell,
# not in a $(...) subshell, so that its pid is kept), waits (10 s at
# most) for its "listening on HOST:PORT" line and sets $addr to HOST:PORT.
start() {
  local name=$1 log=$2
  shift 2
  "$@" >"$log.out" 2>"$log.err" &
  track $! "$name"
  for _ in $(seq 100); do
    if grep -q "listening on" "$log.out" 2>/dev/null; then
      addr=$(sed -n 's/.*listening on //p' "$log.out" | head -n 1)
      return 0
    fi
    if ! alive "${pids[-1]}"; then break; fi
    sleep 0.1
  done
  echo "$name did not start; its log:" >&2
  cat "$log.err" >&2
  return 1
}

start dispatcher "$demo/dispatcher" \
  "$build/dispatcher/ferry-dispatcher" --port 0 --host 127.0.0.1 \
  --work-dir "$demo/dispatcher-state"
dispatcher=$addr
echo "dispatcher at $dispatcher"
for i in 1 2; do
  start "worker$i" "$demo/worker$i" "$build/worker/ferry-worker" \
    --dispatcher "$dispatcher" --port 0 --host 127.0.0.1 --threads 1
  echo "worker $i at $addr"
done

if [ "$imagenet" = 1 ]; then
  spec="tfrecord(\"$data/train-*.tfrecord\") | decode(jpeg) | random_resized_crop(224) | batch(256)"
  trainer_args=(--augment "flip(horizontal)" --gpu --step-ms "$step_ms")
  echo
  echo "== trainer: $epochs epochs of $spec"
  echo "   staging 224x224 batches, flip(horizontal) on the GPU if one is"
  echo "   usable (else on the CPU), sleeping $step_ms ms per batch as a"
  echo "   training step would take"
else
  spec="tfrecord(\"$data/train-*.tfrecord\") | decode(raw, 32, 32, 3) | dilate(3) | blur(11, 0.8) | batch(1024)"
  trainer_args=()
  echo
  echo "== trainer: $epochs epochs of $spec"
fi
# In the background and waited for, so that Ctrl-C or SIGTERM reach the
# traps at once (bash runs a trap only after a foreground command ends).
"$build/client/examples/ferry-example-trainer" --dispatcher "$dispatcher" \
  --spec "$spec" --epochs "$epochs" --job-name demo "${trainer_args[@]}" &
track $! trainer
wait "${pids[-1]}"
if [ "$imagenet" = 1 ]; then
  want=$(awk -v s="$step_ms" 'BEGIN { if (s > 0) printf "%.0f", 256000 / s }')
  echo "(a trainer taking 256 images per $step_ms ms step wants ${want:-unbounded}"
  echo " images/s; the stall fraction is the share of its time spent waiting"
  echo " for data: near 0 when the workers keep up, near 1 when they are the"
  echo " bottleneck; images/s and stall count from the client's start)"
else
  echo "(this trainer does no work per batch, so it spends its time waiting;"
  echo " tests/bench/trainer measures the stall with a simulated training step)"
fi

echo
echo "== cluster status"
"$ferryctl" status --dispatcher "$dispatcher" || true

echo
echo "== shutting down"
stop_all
echo "logs in $demo"
