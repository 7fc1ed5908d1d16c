#!/bin/sh
# Interop tests against real TensorFlow: TFRecords and Examples written by
# TensorFlow and read by Ferry, written by Ferry (interop_check's writer and
# `ferryctl gen`) and read by TensorFlow, and Ferry's image ops against
# TensorFlow's.
#
# Usage: run.sh --checker PATH [--ferryctl PATH] [--work DIR]
#               [--testdata DIR]
#   --checker   the interop_check binary
#   --ferryctl  the ferryctl binary (default: client/ctl/ferryctl beside
#               the checker's build tree)
#   --work      scratch directory, emptied first (default: a mktemp dir)
#   --testdata  ../shared/testdata (its JPEGs join the decode checks)
# Environment: FERRY_SKIP_INTEROP=1 skips (exit 77); FERRY_TF_VENV picks
# the venv (setup-venv.sh).
#
# Prints every check and a last line "interop: N passed, M failed"; exits
# 1 when anything failed.
set -u

here=$(cd "$(dirname "$0")" && pwd)

if [ "${FERRY_SKIP_INTEROP:-0}" = 1 ]; then
  echo "interop: skipped: FERRY_SKIP_INTEROP=1"
  exit 77
fi

checker=''
ferryctl=''
work=''
testdata=''
while [ $# -gt 0 ]; do
  case $1 in
    --checker) checker=$2; shift 2 ;;
    --ferryctl) ferryctl=$2; shift 2 ;;
    --work) work=$2; shift 2 ;;
    --testdata) testdata=$2; shift 2 ;;
    *) echo "run.sh: unknown argument '$1'" >&2; exit 2 ;;
  esac
done
if [ -z "$checker" ]; then
  echo "run.sh: --checker PATH is required" >&2
  exit 2
fi
if [ -z "$ferryctl" ]; then
  # The checker lives in BUILD/tests/interop; ferryctl in BUILD/client/ctl.
  ferryctl=$(cd "$(dirname "$checker")/../.." && pwd)/client/ctl/ferryctl
fi
if [ -z "$work" ]; then
  work=$(mktemp -d /tmp/ferry-interop.XXXXXX)
fi
rm -rf "$work"
mkdir -p "$work"

export TF_CPP_MIN_LOG_LEVEL=2
if [ -n "$testdata" ] && [ -d "$testdata/jpeg" ]; then
  export FERRY_TESTDATA_DIR="$testdata"
else
  echo "info no testdata JPEGs (${testdata:-no --testdata}): only" \
       "TensorFlow-encoded JPEGs are compared"
  unset FERRY_TESTDATA_DIR
fi

pass=0
fail=0
t_start=$(date +%s)

# stage NAME CMD...: runs CMD with its output in $work/NAME.log, shows it,
# and adds its "... N passed, M failed" totals; a command that ends
# without such a line counts as one check, passed when it exits 0.
stage() {
  name=$1
  shift
  t0=$(date +%s)
  "$@" > "$work/$name.log" 2>&1
  rc=$?
  cat "$work/$name.log"
  totals=$(sed -n 's/^[a-z_]*: \([0-9]*\) passed, \([0-9]*\) failed$/\1 \2/p' \
    "$work/$name.log" | tail -n 1)
  if [ -n "$totals" ]; then
    # shellcheck disable=SC2086 # two numbers, split on purpose
    set -- $totals
    pass=$((pass + $1))
    fail=$((fail + $2))
    if [ "$rc" -ne 0 ] && [ "$2" -eq 0 ]; then
      echo "FAIL $name exited with status $rc"
      fail=$((fail + 1))
    fi
  elif [ "$rc" -eq 0 ]; then
    echo "ok   $name"
    pass=$((pass + 1))
  else
    echo "FAIL $name exited with status $rc"
    fail=$((fail + 1))
  fi
  echo "info stage $name took $(( $(date +%s) - t0 )) s"
}

finish() {
  echo "info interop run took $(( $(date +%s) - t_start )) s; logs in $work"
  echo "interop: $pass passed, $fail failed"
  [ "$fail" -eq 0 ] && exit 0
  exit 1
}

t0=$(date +%s)
if ! venv=$("$here/setup-venv.sh" | tail -n 1) || [ -z "$venv" ]; then
  echo "FAIL setup-venv.sh could not create the TensorFlow venv (needs" \
       "python3-venv and PyPI; set FERRY_SKIP_INTEROP=1 to skip)"
  fail=$((fail + 1))
  finish
fi
echo "info venv $venv ready in $(( $(date +%s) - t0 )) s"
py="$venv/bin/python"

# TensorFlow writes, Ferry reads.
stage tf_write "$py" "$here/tf_write.py" "$work/tf"
stage read_expected "$checker" read-expected "$work/tf"

# Ferry writes, TensorFlow reads.
mkdir -p "$work/ferry"
stage ferry_write "$checker" write "$work/ferry"
stage tf_read_ferry "$py" "$here/tf_read.py" \
  --manifest "$work/ferry/manifest.txt"

# Image ops: TensorFlow's outputs, then Ferry's against them.
stage tf_ops_ref "$py" "$here/tf_ops_ref.py" "$work/ops"
stage ops "$checker" ops "$work/ops"

# Datasets from ferryctl gen, read by TensorFlow.
if [ ! -x "$ferryctl" ]; then
  echo "FAIL ferryctl not found at $ferryctl (build the ferryctl target)"
  fail=$((fail + 1))
  finish
fi
# gen_case NAME FORMAT HxW C COMPRESSION SHARDS RECORDS CLASSES: writes
# a dataset and queues it for one tf_read.py run (TensorFlow starts once).
datasets=
gen_case() {
  stage "gen_$1" "$ferryctl" gen --out "$work/gen/$1" --format "$2" \
    --size "$3" --channels "$4" --compression "$5" --shards "$6" \
    --records "$7" --classes "$8" --seed 11
  datasets="$datasets --dataset $2:$3x$4:$7:$8:$work/gen/$1"
}
gen_case raw_none raw 32x32 3 none 4 1000 10
gen_case raw_gzip raw 17x23 1 gzip 3 301 7
gen_case raw_zlib raw 9x11 6 zlib 2 50 1000
gen_case jpeg_none jpeg 32x32 3 none 2 200 10
gen_case jpeg_gzip jpeg 48x40 3 gzip 3 101 5
gen_case jpeg_gray jpeg 24x20 1 zlib 1 30 3
# $datasets is split on blanks on purpose; work paths have none.
case $work in
  *" "*) echo "FAIL work directory '$work' has a blank"; fail=$((fail + 1))
    finish ;;
esac
# shellcheck disable=SC2086
stage tf_read_gen "$py" "$here/tf_read.py" $datasets

finish
