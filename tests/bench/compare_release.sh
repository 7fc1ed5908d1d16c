#!/usr/bin/env bash
# bench_e2e and bench_pipeline of the previous release
# (tests/compat/PREVIOUS_RELEASE) against this tree's, in one command:
# builds both (Release, no CUDA, only those benchmarks and what they run),
# runs them alternately, release then this tree, ROUNDS times, and prints
# every figure's median for both, the ratio new/old of the medians and
# each side's spread over its rounds (max - min over the median: the
# noise to judge the ratio against). Same machine, same minutes: the
# ratios hold where the absolute figures do not.
#
#   tests/bench/compare_release.sh [--rounds N] [--work DIR] [--quick]
#                                  [--only e2e|pipeline]
#
#   --rounds N      runs of each benchmark per side (3)
#   --work DIR      build trees and outputs (default ./build-compare:
#                   release/ is reused while the hash is the same, new/ is
#                   this working tree, results/ the raw outputs)
#   --quick         the benchmarks' --quick runs (a smoke run: the figures
#                   of bench_e2e --quick are too short to compare)
#   --only B        one benchmark
#   FERRY_COMPARE_E2E_ARGS       bench_e2e's arguments (--repeat 3)
#   FERRY_COMPARE_PIPELINE_ARGS  bench_pipeline's (none: its full run)
#   FERRY_COMPARE_JOBS=N         build parallelism (default: nproc)
#
# About 13 minutes on 2 cores with the defaults (bench_pipeline 80 to
# 110 s a run, bench_e2e about 30 s), plus the two builds (about 4
# minutes) the first time.
set -euo pipefail

root=$(cd "$(dirname "$0")/../.." && pwd)
work=$root/build-compare
rounds=3
quick=()
benches=(e2e pipeline)
jobs=${FERRY_COMPARE_JOBS:-$(nproc)}
while [ $# -gt 0 ]; do
  case $1 in
    --rounds) rounds=$2; shift 2 ;;
    --work) work=$2; shift 2 ;;
    --quick) quick=(--quick); shift ;;
    --only) benches=("$2"); shift 2 ;;
    -h|--help) sed -n '2,/^set -euo/p' "$0" | sed '$d; s/^# \{0,1\}//'; exit 0 ;;
    *) echo "usage: tests/bench/compare_release.sh [--rounds N] [--work DIR]" \
         "[--quick] [--only e2e|pipeline]" >&2; exit 2 ;;
  esac
done
for b in "${benches[@]}"; do
  case $b in e2e|pipeline) ;; *) echo "--only e2e or pipeline" >&2; exit 2 ;; esac
done
[[ $rounds =~ ^[1-9][0-9]*$ ]] || { echo "--rounds N, N >= 1" >&2; exit 2; }
read -r -a e2e_args <<<"${FERRY_COMPARE_E2E_ARGS---repeat 3}"
read -r -a pipeline_args <<<"${FERRY_COMPARE_PIPELINE_ARGS-}"

# shellcheck source=tests/compat/release.sh
. "$root/tests/compat/release.sh"
rc=0
release_commit || rc=$?
if [ "$rc" = 1 ]; then exit 0; fi # SKIP: printed
if [ "$rc" != 0 ]; then exit "$rc"; fi

# bench_e2e runs the daemons and bare_transfer of its own tree.
targets=(bench_e2e bench_pipeline bare_transfer ferry-dispatcher ferry-worker)
start=$(date +%s)
echo "== building the release ${release:0:12} in $work/release"
release_build "$work/release" Release "${targets[@]}"
echo "== building this tree ($root, $(git -C "$root" describe --always \
  --dirty 2>/dev/null || echo '?')) in $work/new"
tree_build "$root" "$work/new" Release "${targets[@]}"
echo "   built in $(( $(date +%s) - start )) s"

results=$work/results
rm -rf "$results"
mkdir -p "$results"
run() { # run SIDE BENCH ROUND
  local dir=$work/$1/build/tests/bench out=$results/$2-$1-$3.txt t0 args
  t0=$(date +%s)
  if [ "$2" = e2e ]; then
    args=("${e2e_args[@]}" "${quick[@]}")
    "$dir/bench_e2e" "${args[@]}" >"$out" 2>"$out.err" ||
      { echo "bench_e2e ($1) failed: $(tail -n 5 "$out.err")" >&2; exit 1; }
  else
    args=("${pipeline_args[@]}" "${quick[@]}")
    "$dir/bench_pipeline" "${args[@]}" >"$out" 2>"$out.err" ||
      { echo "bench_pipeline ($1) failed: $(tail -n 5 "$out.err")" >&2; exit 1; }
  fi
  echo "   round $3, bench_$2${args[*]:+ ${args[*]}}, $1:" \
    "$(( $(date +%s) - t0 )) s"
}
for b in "${benches[@]}"; do
  echo "== bench_$b: $rounds rounds of release, this tree"
  for r in $(seq "$rounds"); do
    run release "$b" "$r"
    run new "$b" "$r"
  done
done
echo
python3 "$root/tests/bench/compare_release.py" "$results" "${release:0:12}"
echo "(raw outputs in $results; $(( $(date +%s) - start )) s in all)"
