#!/usr/bin/env bash
# Ferry's main job on one machine, from a fresh Debian 12 machine: installs
# what it needs, builds, generates a synthetic dataset and runs the seed
# pipeline (read + CRC, parse, decode, dilate, blur) on it, stage by stage,
# next to scalar baselines measured in the same run.
#
#   deploy/demo.sh              32x32 raw images, 100,000 records
#   FERRY_DEMO_DIR=DIR          where the dataset goes (default /tmp/ferry-demo)
#   FERRY_DEMO_RECORDS=N        dataset size
set -euo pipefail

root=$(cd "$(dirname "$0")/.." && pwd)
build=${FERRY_BUILD_DIR:-$root/build-release}
data=${FERRY_DEMO_DIR:-/tmp/ferry-demo}
records=${FERRY_DEMO_RECORDS:-100000}

"$root/deploy/install-deps.sh"
cmake -S "$root" -B "$build" -DCMAKE_BUILD_TYPE=Release >/dev/null
cmake --build "$build" -j "$(nproc)" --target ferryctl
ferryctl=$build/client/ctl/ferryctl

echo "== generating $records 32x32x3 raw records in $data"
rm -rf "$data"
"$ferryctl" gen --out "$data" --shards "$(nproc)" --records "$records" \
  --format raw --size 32x32 --seed 7
echo "== first shard"
"$ferryctl" records inspect "$(ls "$data"/*.tfrecord | head -n 1)"
echo "== seed pipeline: decode(raw, 32, 32, 3) | dilate(3) | blur(11, 0.8)"
"$ferryctl" bench pipeline --dir "$data"
