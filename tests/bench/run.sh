#!/bin/sh
# Builds Ferry in Release mode and runs the full pipeline benchmark.
#
#   tests/bench/run.sh [BUILD_DIR] [bench_pipeline options...]
#
# BUILD_DIR defaults to build-bench in the source tree; options go to
# bench_pipeline (e.g. --quick, --threads 4). The table goes to stdout;
# docs/PERFORMANCE.md records a run and how to read it.
set -eu

root=$(cd "$(dirname "$0")/../.." && pwd)
build="$root/build-bench"
case "${1:-}" in
  ""|-*) ;;
  *) build=$1; shift ;;
esac

cmake -S "$root" -B "$build" -DCMAKE_BUILD_TYPE=Release \
  -DFERRY_WITH_CUDA=OFF >&2
cmake --build "$build" -j"${FERRY_JOBS:-2}" --target bench_pipeline \
  >&2
exec "$build/tests/bench/bench_pipeline" "$@"
