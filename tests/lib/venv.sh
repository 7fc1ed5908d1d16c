# shellcheck shell=sh
# Sourced by the scripts that keep a Python venv under ~/.cache/ferry
# (tests/python/setup-venv.sh, tests/interop/setup-venv.sh).
#
# make_venv VENV PYTHON [VENV-ARGS...]
#   (Re)creates VENV with `PYTHON -m venv VENV-ARGS VENV`. Refuses (returns
#   1, saying why on stderr) when PYTHON lacks venv/ensurepip, or when VENV
#   is a non-empty folder that is not a venv: a mistyped path in an
#   environment variable must never make it delete someone's files.
make_venv() {
  mv_venv=$1
  mv_py=$2
  shift 2
  if ! "$mv_py" -c 'import venv, ensurepip' 2>/dev/null; then
    echo "setup-venv: $mv_py lacks the venv/ensurepip modules" \
         "(on Debian: apt-get install python3-venv)" >&2
    return 1
  fi
  if [ -d "$mv_venv" ] && [ -n "$(ls -A "$mv_venv")" ] &&
     [ ! -f "$mv_venv/pyvenv.cfg" ]; then
    echo "setup-venv: $mv_venv exists and is not a venv; not touching it" >&2
    return 1
  fi
  rm -rf "$mv_venv"
  mkdir -p "$(dirname "$mv_venv")"
  "$mv_py" -m venv "$@" "$mv_venv"
}
