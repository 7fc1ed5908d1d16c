#!/usr/bin/env bash
# The GPU checks in one go, under 5 minutes on a GPU machine (an H200):
# configure with CUDA for sm_90, build the augmentation's CPU test, GPU
# test and GPU benchmark, run them. Results go to $OUT (if set) as
# gpu-env.txt, test_augment.txt, test_augment_gpu.txt and
# bench_augment_gpu.txt; docs/PERFORMANCE.md records the benchmark's
# table.
#
# Usage: tests/gpu/run.sh [build-dir]   (default: build-gpu in the tree)
# Environment: CUDA_ARCH (default 90), JOBS (default: the CPU count),
#   FERRY_WITH_UCX (default OFF: the GPU path does not need UCX),
#   BENCH_ARGS (extra bench_augment_gpu arguments, e.g. "--iters 50").
# Exit status: 0 all passed, 77 no usable GPU (the programs say why),
# anything else a failure.
set -euo pipefail

root=$(cd "$(dirname "$0")/../.." && pwd)
build=${1:-$root/build-gpu}
arch=${CUDA_ARCH:-90}
jobs=${JOBS:-$(nproc)}
out=${OUT:-}
if [ -n "$out" ]; then
  mkdir -p "$out"
fi

# Runs a command with a time limit, keeping its output in $out/<name>.txt.
step() {
  local name=$1 limit=$2
  shift 2
  echo "== $name: $*"
  local rc=0
  if [ -n "$out" ]; then
    timeout "$limit" "$@" 2>&1 | tee "$out/$name.txt" || rc=${PIPESTATUS[0]}
  else
    timeout "$limit" "$@" || rc=$?
  fi
  if [ "$rc" -eq 124 ]; then
    echo "== $name: timed out after ${limit}s"
  fi
  return "$rc"
}

start=$(date +%s)
{
  echo "date: $(date -u +%Y-%m-%dT%H:%M:%SZ)"
  echo "commit: $(git -C "$root" rev-parse --short HEAD 2>/dev/null || echo unknown)"
  echo "nvcc: $(command -v nvcc || echo /usr/local/cuda/bin/nvcc)"
  (nvcc --version 2>/dev/null || /usr/local/cuda/bin/nvcc --version) | tail -1
  if command -v nvidia-smi >/dev/null; then
    nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader 2>&1 || true
  else
    echo "nvidia-smi: not found"
  fi
} | if [ -n "$out" ]; then tee "$out/gpu-env.txt"; else cat; fi

step configure 120 cmake -S "$root" -B "$build" \
  -DCMAKE_BUILD_TYPE=Release \
  -DFERRY_WITH_CUDA=ON \
  -DCMAKE_CUDA_ARCHITECTURES="$arch" \
  -DFERRY_WITH_UCX="${FERRY_WITH_UCX:-OFF}" \
  -DFERRY_BUILD_TESTS=ON >/dev/null
step build 180 cmake --build "$build" -j "$jobs" \
  --target test_augment test_augment_gpu test_staging_gpu bench_augment_gpu

status=0
step test_augment 60 "$build/client/test_augment" --jobs "$jobs" || status=$?
gpu=0
step test_augment_gpu 60 "$build/tests/gpu/test_augment_gpu" || gpu=$?
step test_staging_gpu 60 "$build/tests/gpu/test_staging_gpu" --seconds 3 ||
  { s=$?; [ "$gpu" -eq 0 ] && gpu=$s; }
# shellcheck disable=SC2086
step bench_augment_gpu 90 "$build/tests/gpu/bench_augment_gpu" \
  ${BENCH_ARGS:-} || { b=$?; [ "$gpu" -eq 0 ] && gpu=$b; }

echo "== done in $(( $(date +%s) - start ))s"
if [ "$status" -ne 0 ]; then
  echo "tests/gpu/run.sh: the CPU test failed ($status)"
  exit "$status"
fi
if [ "$gpu" -eq 77 ]; then
  echo "tests/gpu/run.sh: no usable GPU (skipped)"
  exit 77
fi
if [ "$gpu" -ne 0 ]; then
  echo "tests/gpu/run.sh: a GPU program failed ($gpu)"
  exit "$gpu"
fi
echo "tests/gpu/run.sh: ok"
