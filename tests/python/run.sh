#!/bin/sh
# Runs the Python suite (pytest) against this tree's `ferry` package and
# daemons.
#
# Usage: run.sh ferry|tensorflow [--build-dir DIR] [--no-setup]
#               [-- PYTEST-ARGS...]
#   ferry       the main suite in the venv of setup-venv.sh (Debian's torch
#               and numpy): every test_*.py but the TensorFlow ones
#   tensorflow  test_tensorflow.py and test_mwms.py (MultiWorkerMirrored
#               Strategy) in the TensorFlow venv of
#               tests/interop/setup-venv.sh; exits 77 (skipped) with the
#               reason when that venv cannot be had
#   --build-dir the CMake build tree's tests/python directory (package
#               build, wheel, pytest's temporary files); the daemons are
#               taken from FERRY_PY_DISPATCHER, FERRY_PY_WORKER and
#               FERRY_PY_FERRYCTL, else from the build tree two levels up
#   --no-setup  use the venv and wheel as they are (ctest: the test
#               python/setup built and installed them just before)
set -eu

here=$(cd "$(dirname "$0")" && pwd)
suite=${1:-}
case $suite in
  ferry|tensorflow) shift ;;
  *) echo "usage: run.sh ferry|tensorflow [--build-dir DIR] [--no-setup]" \
          "[-- PYTEST-ARGS...]" >&2; exit 2 ;;
esac
build="$here/../../build/tests/python"
setup=1
while [ $# -gt 0 ]; do
  case $1 in
    --build-dir) build=$2; shift 2 ;;
    --no-setup) setup=0; shift ;;
    --) shift; break ;;
    *) echo "run.sh: unknown argument '$1'" >&2; exit 2 ;;
  esac
done
mkdir -p "$build"
build=$(cd "$build" && pwd)
tree=$(cd "$build/../.." && pwd)
export FERRY_PY_DISPATCHER="${FERRY_PY_DISPATCHER:-$tree/dispatcher/ferry-dispatcher}"
export FERRY_PY_WORKER="${FERRY_PY_WORKER:-$tree/worker/ferry-worker}"
export FERRY_PY_FERRYCTL="${FERRY_PY_FERRYCTL:-$tree/client/ctl/ferryctl}"
export TF_CPP_MIN_LOG_LEVEL=2
export PYTHONDONTWRITEBYTECODE=1

if [ "$suite" = ferry ]; then
  if [ "$setup" = 1 ]; then
    venv=$("$here/setup-venv.sh" --build-dir "$build" | tail -n 1)
  else
    venv=${FERRY_PY_VENV:-$HOME/.cache/ferry/venv-py}
  fi
  set -- --ignore=test_tensorflow.py --ignore=test_mwms.py "$@"
else
  rc=0
  out=$("$here/setup-venv.sh" --build-dir "$build" --tf) || rc=$?
  if [ "$rc" = 77 ]; then
    echo "$out"
    exit 77
  fi
  [ "$rc" = 0 ] || exit "$rc"
  venv=$(echo "$out" | tail -n 1)
  set -- test_tensorflow.py test_mwms.py "$@"
fi

cd "$here"
# -rs prints every skip's reason; no cache or hypothesis directories in
# the source tree (Debian's python3-hypothesis registers a pytest plugin);
# a test still running after 120 s gets every thread's traceback. pytest
# empties --basetemp when it starts: ctest runs the suite on gRPC and on
# UCX at once, so each transport has its own.
exec "$venv/bin/python" -m pytest -p no:cacheprovider -p no:hypothesispytest \
  -rs -v -o faulthandler_timeout=120 \
  --basetemp="$build/tmp-$suite${FERRY_TRANSPORT:+-$FERRY_TRANSPORT}" "$@"
