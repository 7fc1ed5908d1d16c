#!/bin/sh
# The Python feed benchmark (tests/bench/python_feed.py): records/s
# of one local cluster (a dispatcher and 2 workers) feeding (a) the C example
# trainer, (b) a Python loop over ferry.Client making torch tensors with
# torch.from_dlpack, and, without Ferry, (c) a DataLoader with 2 worker
# processes reading the same TFRecords with the `tfrecord` package and doing
# decode, dilate and blur with torch ops. docs/PERFORMANCE.md records a run.
#
#   tests/bench/python_feed.sh [python_feed.py options, e.g. --quick]
#
#   FERRY_BUILD_DIR=DIR      Release build tree (default <repo>/build-pyb),
#                            configured and built here unless
#                            FERRY_BENCH_NO_BUILD=1
#   FERRY_BENCH_VENV=DIR     venv to run in; default: the one
#                            tests/python/setup-venv.sh makes
#                            (${FERRY_PY_VENV:-~/.cache/ferry/venv-py}) if it
#                            has `ferry`, else /tmp/venv-bench, made here
#                            (/usr/bin/python3 -m venv --system-site-packages,
#                            pip install ./client/python)
#   FERRY_BENCH_NO_SETUP=1   never make a venv or build the package: skip
#                            (exit 77, reason printed) when they are not
#                            there (the ctest smoke run sets it)
# `tfrecord` (PyPI, small, pure Python) is installed into the venv when it
# lacks it (a skip if pip cannot, or under FERRY_BENCH_NO_SETUP=1: then
# tests/python/setup-venv.sh is the one that installs it).
# Exit status: python_feed.py's (0 ok, 1 failure, 77 skipped).
set -eu

root=$(cd "$(dirname "$0")/../.." && pwd)
build=${FERRY_BUILD_DIR:-$root/build-pyb}
no_setup=${FERRY_BENCH_NO_SETUP:-0}
pipq="--quiet --disable-pip-version-check --no-input"

skip() {
  echo "SKIP: $*"
  exit 77
}

if [ "${FERRY_BENCH_NO_BUILD:-0}" != 1 ]; then
  cmake -S "$root" -B "$build" -DCMAKE_BUILD_TYPE=Release \
    -DFERRY_WITH_CUDA=OFF >&2
  cmake --build "$build" -j"${FERRY_JOBS:-2}" --target ferryctl \
    ferry-dispatcher ferry-worker ferry-example-trainer >&2
fi

has() { # has PYTHON MODULE
  "$1" -c "import $2" >/dev/null 2>&1
}

venv=${FERRY_BENCH_VENV:-}
if [ -z "$venv" ]; then
  tv=${FERRY_PY_VENV:-$HOME/.cache/ferry/venv-py}
  if [ -x "$tv/bin/python" ] && has "$tv/bin/python" ferry; then
    venv=$tv
  else
    venv=/tmp/venv-bench
  fi
fi
py=$venv/bin/python
if [ ! -x "$py" ]; then
  [ "$no_setup" != 1 ] || skip "no venv at $venv (run tests/python/setup-venv.sh or tests/bench/python_feed.sh)"
  echo "making $venv" >&2
  /usr/bin/python3 -m venv --system-site-packages "$venv"
fi
if ! has "$py" ferry; then
  [ "$no_setup" != 1 ] || skip "$venv has no ferry package (pip install ./client/python)"
  echo "installing ./client/python into $venv (builds libferry: minutes)" >&2
  "$py" -m pip install $pipq "$root/client/python" >&2
fi
if ! has "$py" tfrecord; then
  [ "$no_setup" != 1 ] || skip "$venv has no tfrecord package (tests/python/setup-venv.sh installs it)"
  echo "installing tfrecord (PyPI) into $venv" >&2
  "$py" -m pip install $pipq --timeout 30 tfrecord==1.14.6 >&2 ||
    skip "$venv has no tfrecord package and pip could not install it"
fi
has "$py" torch ||
  skip "torch cannot be imported from $venv (Debian's python3-torch, seen through --system-site-packages)"

echo "venv $venv, build $build" >&2
exec "$py" "$root/tests/bench/python_feed.py" --build-dir "$build" "$@"
