#!/usr/bin/env bash
# Runs every fuzz target in BUILD_DIR/tests/fuzz for SECONDS each, starting
# from its seed corpus, tests/fuzz/<concern>/corpus/<name>/ (copied, so the
# committed corpus stays as it is).
# Exits non-zero on the first crash, leak or sanitizer report.
#
# The mutation sequence is seeded (FERRY_FUZZ_SEED, default 1), so a run is
# the prefix of any longer run with the same seed: what CI explores in its
# minute was explored before landing. Set another seed to explore anew.
set -euo pipefail
build=${1:?usage: run.sh BUILD_DIR [SECONDS]}
seconds=${2:-60}
here=$(cd "$(dirname "$0")" && pwd)
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
status=0
for bin in "$build"/tests/fuzz/fuzz_*; do
  [ -x "$bin" ] || continue
  name=$(basename "$bin"); name=${name#fuzz_}
  mkdir -p "$work/$name"
  for seeds in "$here"/*/corpus/"$name"; do
    if [ -d "$seeds" ]; then cp -r "$seeds/." "$work/$name/"; fi
  done
  echo "fuzz_$name: ${seconds}s"
  if ! "$bin" -seed="${FERRY_FUZZ_SEED:-1}" -max_total_time="$seconds" \
       -rss_limit_mb=2048 -timeout=10 \
       -print_final_stats=1 -artifact_prefix="$work/crash-$name-" \
       "$work/$name" > "$work/$name.log" 2>&1; then
    tail -n 60 "$work/$name.log"
    for c in "$work"/crash-"$name"-*; do
      [ -e "$c" ] && { echo "reproducer: $c"; od -A x -t x1z "$c" | head -n 20; }
    done
    status=1
  else
    grep -E 'stat::number_of_executed_units|Done [0-9]+ runs' "$work/$name.log" | tail -n 2 || true
  fi
done
exit $status
