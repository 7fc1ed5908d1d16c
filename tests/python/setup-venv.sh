#!/bin/sh
# Makes the venv the Python suite runs in and installs this tree's `ferry`
# package into it; prints the venv's path on the last line of stdout.
#
# Usage: setup-venv.sh [--build-dir DIR] [--tf]
#   --build-dir DIR  where the package is built (default:
#                    <repo>/build/tests/python): DIR/skbuild is
#                    scikit-build-core's CMake tree, kept between runs so a
#                    rebuild is incremental; DIR/wheel holds the wheel.
#   --tf             also install that wheel (built before, or now) into
#                    the TensorFlow venv of tests/interop/setup-venv.sh
#                    (made there if needed, with pytest added) and print
#                    that venv's path instead. Exits 77 with the reason
#                    when that venv cannot be had.
#
# The venv (${FERRY_PY_VENV:-~/.cache/ferry/venv-py}) is made once with
# /usr/bin/python3 -m venv --system-site-packages, so Debian's python3-torch
# (1.13, CPU) and python3-numpy are seen from it: the Python registry's
# torch wheel pulls gigabytes of CUDA libraries. The package is always
# rebuilt and reinstalled, since it changes with the tree: one wheel is
# built (`pip wheel`, no build isolation: the build requirements named in
# client/python/pyproject.toml are installed into the venv once) and that
# wheel is installed with --no-deps --force-reinstall.
set -eu

root=$(cd "$(dirname "$0")/../.." && pwd)
# shellcheck source=../lib/venv.sh
. "$root/tests/lib/venv.sh"
build="$root/build/tests/python"
tf=0
while [ $# -gt 0 ]; do
  case $1 in
    --build-dir) build=$2; shift 2 ;;
    --tf) tf=1; shift ;;
    *) echo "setup-venv: unknown argument '$1'" >&2; exit 2 ;;
  esac
done
mkdir -p "$build"
build=$(cd "$build" && pwd)
VENV=${FERRY_PY_VENV:-$HOME/.cache/ferry/venv-py}
PY=${FERRY_PY_PYTHON:-/usr/bin/python3}
pkg="$root/client/python"
wheels="$build/wheel"
pipq="--quiet --disable-pip-version-check --no-input"

# The build requirements, read from pyproject.toml.
reqs=$("$PY" - "$pkg/pyproject.toml" <<'EOF'
import sys, tomllib
with open(sys.argv[1], "rb") as f:
    print(" ".join(tomllib.load(f)["build-system"]["requires"]))
EOF
)
# tfrecord (PyPI, pure Python) is the baseline reader of
# tests/bench/python_feed.sh, which runs in this venv.
reqs="$reqs tfrecord==1.14.6"
marker="$VENV/.ferry-ready"
want="system-site-packages; build: $reqs"

if [ ! -x "$VENV/bin/python" ] || [ ! -f "$marker" ] ||
   [ "$(cat "$marker")" != "$want" ]; then
  echo "setup-venv: creating $VENV (--system-site-packages)" >&2
  make_venv "$VENV" "$PY" --system-site-packages || exit 1
  # shellcheck disable=SC2086 # lists
  "$VENV/bin/python" -m pip install $pipq $reqs >&2
  printf '%s' "$want" > "$marker"
fi

build_wheel() {
  rm -rf "$wheels"
  mkdir -p "$wheels"
  t0=$(date +%s)
  # shellcheck disable=SC2086
  if ! "$VENV/bin/python" -m pip wheel $pipq --no-deps --no-build-isolation \
       --config-settings=build-dir="$build/skbuild" -w "$wheels" "$pkg" >&2
  then
    echo "setup-venv: building the ferry wheel from $pkg failed" >&2
    exit 1
  fi
  echo "setup-venv: built $(ls "$wheels") in $(( $(date +%s) - t0 )) s" >&2
}

wheel() {
  set -- "$wheels"/ferry-*.whl
  if [ ! -f "$1" ]; then
    echo "setup-venv: no wheel in $wheels" >&2
    exit 1
  fi
  echo "$1"
}

if [ "$tf" = 0 ]; then
  build_wheel
  # shellcheck disable=SC2086
  "$VENV/bin/python" -m pip install $pipq --no-deps --force-reinstall \
    "$(wheel)" >&2
  # Imported from outside the source tree: the installed package, not
  # client/python/ferry.
  (cd / && "$VENV/bin/python" -c 'import ferry, sys
print("setup-venv: ferry", ferry.__version__, "libferry", ferry.version(),
      "at", ferry.__file__, file=sys.stderr)')
  echo "$VENV"
  exit 0
fi

# --tf: the TensorFlow venv. FERRY_SKIP_INTEROP=1 (no network) skips it,
# as it skips tests/interop.
if [ "${FERRY_SKIP_INTEROP:-0}" = 1 ]; then
  echo "setup-venv: skipped: FERRY_SKIP_INTEROP=1 (no TensorFlow venv)"
  exit 77
fi
if ! tfvenv=$("$root/tests/interop/setup-venv.sh" | tail -n 1) ||
   [ ! -x "$tfvenv/bin/python" ]; then
  echo "setup-venv: skipped: the TensorFlow venv could not be made" \
       "(tests/interop/setup-venv.sh failed; see above)"
  exit 77
fi
# pytest is pinned like TensorFlow there, so a release cannot change a run.
if ! "$tfvenv/bin/python" -c 'import pytest' 2>/dev/null; then
  echo "setup-venv: adding pytest to $tfvenv" >&2
  # shellcheck disable=SC2086
  if ! "$tfvenv/bin/python" -m pip install $pipq pytest==9.2.0 >&2; then
    echo "setup-venv: skipped: pytest cannot be installed into $tfvenv"
    exit 77
  fi
fi
[ -f "$(wheel 2>/dev/null)" ] || build_wheel
# shellcheck disable=SC2086
"$tfvenv/bin/python" -m pip install $pipq --no-deps --force-reinstall \
  "$(wheel)" >&2
echo "$tfvenv"
