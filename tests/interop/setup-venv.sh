#!/bin/sh
# Creates, once, the Python virtual environment with TensorFlow that the
# interop tests run in, and prints its path on the last line of stdout.
# A marker file that names the pinned versions makes a second run instant;
# changing a pin below rebuilds the environment.
#
# Usage: setup-venv.sh
# The venv goes to ${FERRY_TF_VENV:-~/.cache/ferry/venv-tf};
# FERRY_TF_PYTHON picks the interpreter (default /usr/bin/python3).
# Needs: /usr/bin/python3 with the venv module (Debian: python3-venv) and
# access to PyPI.
set -eu
# shellcheck source=../lib/venv.sh
. "$(cd "$(dirname "$0")/../lib" && pwd)/venv.sh"

TF_VERSION=2.20.0
NUMPY_VERSION=2.2.6
PROTOBUF_VERSION=7.36.2
VENV=${FERRY_TF_VENV:-$HOME/.cache/ferry/venv-tf}
PY=${FERRY_TF_PYTHON:-/usr/bin/python3}
MARKER="$VENV/.ferry-ready"
# The versions TensorFlow imports at run time are pinned too, so a new
# numpy or protobuf release cannot change a CI run.
WANT="tensorflow-cpu==$TF_VERSION numpy==$NUMPY_VERSION"
WANT="$WANT protobuf==$PROTOBUF_VERSION"

if [ -f "$MARKER" ] && [ "$(cat "$MARKER")" = "$WANT" ] &&
   [ -x "$VENV/bin/python" ]; then
  echo "$VENV"
  exit 0
fi

echo "setup-venv: creating $VENV (downloads TensorFlow, ~250 MB)" >&2
make_venv "$VENV" "$PY" || exit 1
# A partial install must not leave a venv that looks ready: the marker is
# written last.
# shellcheck disable=SC2086 # $WANT is a list of requirements
"$VENV/bin/python" -m pip install --quiet --disable-pip-version-check \
  --no-input $WANT >&2
TF_CPP_MIN_LOG_LEVEL=2 "$VENV/bin/python" -c \
  'import tensorflow as tf; print("setup-venv: tensorflow", tf.__version__)' >&2
printf '%s' "$WANT" > "$MARKER"
echo "$VENV"
