#!/bin/sh
# The JPEG benchmark in one command: RandomResizedCrop(224) per core
# on ImageNet-like JPEGs, Ferry against tf.data and the PyTorch DataLoader,
# on the same images, in the same run, one table with the ratios.
#
#   tests/bench/imagenet.sh [--quick] [--records N] [--seconds S]
#
# 1. `ferryctl gen --format jpeg --content photo --size imagenet
#    --quality 90` writes the dataset (photo-like scenes in ImageNet's
#    spread of sizes, mostly 375x500; it prints the bytes per image and per
#    pixel);
# 2. bench_jpeg_crop measures Ferry's fused decode and Ferry's full decode
#    followed by the same resize, the window decode on the same JPEGs
#    rewritten as `ferryctl records optimize` does, and a bound: TurboJPEG decoding each
#    whole image at 1/8 scale, the entropy decoding of the whole file
#    (a crop pays it down to its last row; not a competitor), and (not
#    with --quick) the whole-image decode at each DCT scale; it exports
#    the JPEGs as files;
# 3. imagenet_baselines.py measures tf.data (in the TensorFlow venv of
#    tests/interop/setup-venv.sh) and the seeds' PyTorch DataLoader path
#    (Debian's python3-torch, python3-torchvision, python3-pil under
#    /usr/bin/python3) on those files. A baseline that cannot run is
#    skipped with its reason printed.
# Every path runs on one thread pinned to one CPU; figures are images per
# second of CPU time (per core), wall-clock rates next to them.
#
#   FERRY_BUILD_DIR=DIR   build tree with client/ctl/ferryctl and
#                         tests/bench/bench_jpeg_crop (default <repo>/build)
#   FERRY_TF_VENV=DIR     TensorFlow venv (default ~/.cache/ferry/venv-tf)
#   FERRY_TORCH_PYTHON=P  interpreter with torch, torchvision and PIL
#                         (default /usr/bin/python3)
#   FERRY_BENCH_DIR=DIR   where the data goes (default: a temporary
#                         directory, removed at the end)
# Prints "bench imagenet: ok" when every path that ran decoded every image
# to 224x224x3; the targets (Ferry fused >= 1,500 images/s per core and
# >= 5x the fastest of its full decode, tf.data and PyTorch) are printed
# as PASS or MISS, and a MISS does not fail the run (machines differ;
# docs/PERFORMANCE.md has the figures).
set -eu

root=$(cd "$(dirname "$0")/../.." && pwd)
build=${FERRY_BUILD_DIR:-$root/build}
venv=${FERRY_TF_VENV:-$HOME/.cache/ferry/venv-tf}
torch_py=${FERRY_TORCH_PYTHON:-/usr/bin/python3}
records=2000
seconds=3
scales=--scales
while [ $# -gt 0 ]; do
  case $1 in
    --quick) records=32 seconds=0.2 scales= ;;
    --records) records=${2:?--records needs a value}; shift ;;
    --seconds) seconds=${2:?--seconds needs a value}; shift ;;
    *) echo "imagenet.sh: unknown argument '$1'" >&2; exit 2 ;;
  esac
  shift
done

ferryctl=$build/client/ctl/ferryctl
bench=$build/tests/bench/bench_jpeg_crop
for b in "$ferryctl" "$bench"; do
  [ -x "$b" ] || { echo "imagenet.sh: $b is not built" >&2; exit 1; }
done
if [ -n "${FERRY_BENCH_DIR:-}" ]; then
  dir=$FERRY_BENCH_DIR
  mkdir -p "$dir"
else
  dir=$(mktemp -d /tmp/ferry-imagenet-XXXXXX)
  trap 'rm -rf "$dir"' EXIT
fi
rm -rf "$dir/data" "$dir/jpeg"
results=$dir/results
: >"$results"

echo "== machine: $(nproc) CPUs, $(sed -n 's/^model name[^:]*: //p' \
  /proc/cpuinfo | head -n 1), load average $(cut -d' ' -f1-3 \
  /proc/loadavg); $(date -u '+%Y-%m-%d %H:%M UTC')"
echo "== dataset: $records ImageNet-like JPEGs (quality 90)"
"$ferryctl" gen --out "$dir/data" --records "$records" --shards 1 \
  --format jpeg --content photo --size imagenet --quality 90 --seed 13 \
  --classes 1000

echo
echo "== Ferry (bench_jpeg_crop)"
"$bench" --data "$dir/data/train-*.tfrecord" --seconds "$seconds" \
  --export "$dir/jpeg" $scales | tee "$dir/ferry.out"
grep '^RESULT' "$dir/ferry.out" >>"$results"
grep -q '^bench jpeg_crop: ok' "$dir/ferry.out"

# baseline NAME PYTHON FRAMEWORK: runs imagenet_baselines.py; a skip (77)
# or a missing interpreter is printed, a failure fails the benchmark.
baseline() {
  echo
  echo "== $1"
  if [ ! -x "$2" ]; then
    echo "SKIP $1: no interpreter $2"
    return 0
  fi
  rc=0
  "$2" "$root/tests/bench/imagenet_baselines.py" "$3" "$dir/jpeg" \
    --seconds "$seconds" >"$dir/$3.out" 2>"$dir/$3.err" || rc=$?
  grep -v '^RESULT' "$dir/$3.out" || true
  if [ "$rc" = 77 ]; then
    return 0
  fi
  if [ "$rc" != 0 ] || ! grep -q '^baselines: ok' "$dir/$3.out"; then
    echo "imagenet.sh: $1 failed (exit $rc):" >&2
    tail -n 20 "$dir/$3.err" >&2
    exit 1
  fi
  grep '^RESULT' "$dir/$3.out" >>"$results"
}
baseline "tf.data" "$venv/bin/python" tf
baseline "PyTorch DataLoader" "$torch_py" torch

echo
echo "== RandomResizedCrop($((224))) and flip, per core, one run"
awk '
  $1 == "RESULT" && $2 == "bytes-per-image" { bpi = $3; bpp = $4; next }
  $1 == "RESULT" {
    n++; name[n] = $2; cpu[n] = $3; wall[n] = $4
    label = $5; for (i = 6; i <= NF; i++) label = label " " $i
    lab[n] = label
    if ($2 == "ferry-fused") fused = $3
    else if ($2 == "ferry-window") window = $3
    else if ($2 !~ /^ferry-fused/ && $2 !~ /^floor-/) {
      if ($3 > best) { best = $3; bestname = label }
      if ($2 !~ /^ferry-/ && $3 > ext) { ext = $3; extname = label }
    }
  }
  END {
    printf "dataset: %.0f bytes per image, %.3f bytes per pixel\n", bpi, bpp
    print "| path | images/s per core (CPU) | images/s (wall) | Ferry fused / this |"
    print "|---|---|---|---|"
    for (i = 1; i <= n; i++)
      printf "| %s | %.0f | %.0f | %.2fx |\n", lab[i], cpu[i], wall[i], fused / cpu[i]
    printf "Ferry fused: %.0f images/s per core (target >= 1500: %s)\n", fused, (fused >= 1500 ? "PASS" : "MISS")
    if (best > 0)
      printf "fastest other (Ferry full decode, tf.data, PyTorch): %s, %.0f images/s; Ferry fused is %.2fx it (target >= 5x: %s)\n", bestname, best, fused / best, (fused >= 5 * best ? "PASS" : "MISS")
    if (ext > 0)
      printf "fastest outside Ferry: %s, %.0f images/s; Ferry fused is %.2fx it\n", extname, ext, fused / ext
    else
      print "fastest outside Ferry: none measured (both baselines skipped)"
    if (window > 0) {
      printf "Ferry window decode on the optimized JPEGs (ferryctl records optimize): %.0f images/s per core (target >= 1800: %s), %.2fx Ferry fused on the originals (target >= 1.6x: %s)", window, (window >= 1800 ? "PASS" : "MISS"), window / fused, (window >= 1.6 * fused ? "PASS" : "MISS")
      if (best > 0)
        printf ", %.2fx the fastest full decode (target >= 2x: %s)", window / best, (window >= 2 * best ? "PASS" : "MISS")
      printf "\n"
    }
  }' "$results"
echo "bench imagenet: ok"
