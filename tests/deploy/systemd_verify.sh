#!/usr/bin/env bash
# deploy/systemd checked by systemd's own tools and by the binaries:
#  1. every flag the units and the example env files use or document exists:
#     each unit's ExecStart line, with the example env file's variable
#     expanded, runs with --help (an unknown flag or a bad value exits 2),
#     and every --flag the env file's comments mention is in --help;
#  2. `systemd-analyze verify` on both units (ExecStart pointed at this
#     build's binaries, which it checks exist), failing on any line it
#     prints about our units (unknown keys and bad values are only
#     warnings to it);
#  3. `systemd-analyze security --offline` keeps each unit's exposure at
#     2.0 or below ("OK"), so a loosened hardening line fails here.
# Skips (77) with the reason where systemd-analyze is missing, after 1.
#
#   systemd_verify.sh SOURCE_DIR DISPATCHER_BIN WORKER_BIN
set -euo pipefail

src=${1:?source dir}
# Absolute: a unit's ExecStart must be.
declare -A bin=([dispatcher]=$(realpath "${2:?dispatcher binary}")
                [worker]=$(realpath "${3:?worker binary}"))
units=$src/deploy/systemd
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
fail=0

for d in dispatcher worker; do
  unit=$units/ferry-$d.service
  env=$units/$d.env
  var=FERRY_${d^^}_ARGS
  exec_line=$(sed -n 's/^ExecStart=//p' "$unit")
  [ "$(printf '%s\n' "$exec_line" | wc -l)" -eq 1 ] ||
    { echo "FAIL $unit: expected one ExecStart= line"; fail=1; continue; }
  grep -q "^EnvironmentFile=/etc/ferry/$d.env$" "$unit" ||
    { echo "FAIL $unit: no EnvironmentFile=/etc/ferry/$d.env"; fail=1; }
  case $exec_line in
    "/usr/local/bin/ferry-$d "*"\$$var"*) ;;
    *) echo "FAIL $unit: ExecStart does not run /usr/local/bin/ferry-$d with \$$var: $exec_line"
       fail=1; continue ;;
  esac
  # The env file's value, read the way systemd does for this simple form:
  # VAR="..." on one line.
  args=$(sed -n "s/^$var=\"\\(.*\\)\"\$/\\1/p" "$env")
  [ -n "$args" ] || { echo "FAIL $env: no $var=\"...\" line"; fail=1; continue; }
  # %S is the state root (/var/lib); $VAR splits at spaces like systemd's.
  line=${exec_line//%S/$tmp/state}
  line=${line/\/usr\/local\/bin\/ferry-$d/${bin[$d]}}
  line=${line/\$$var/$args}
  # shellcheck disable=SC2086 # word splitting is what systemd does
  if out=$($line --help 2>&1); then
    echo "ok   ferry-$d.service ExecStart with $d.env's example: flags accepted"
  else
    echo "FAIL ferry-$d.service ExecStart with $d.env's example: $line --help:"
    echo "$out"; fail=1
  fi
  help=$("${bin[$d]}" --help)
  for flag in $(grep -oh -- '--[a-z][a-z-]*' "$env" "$unit" | sort -u); do
    if ! grep -q -- "^  $flag " <<<"$help"; then
      echo "FAIL $d.env or ferry-$d.service names $flag, which ferry-$d --help does not list"
      fail=1
    fi
  done
done
[ "$fail" -eq 0 ] || exit 1
echo "ok   every flag named in deploy/systemd exists"

if ! command -v systemd-analyze >/dev/null 2>&1; then
  echo "SKIP: systemd-analyze not found (Debian package 'systemd', installed by deploy/install-deps.sh); the units were not verified"
  exit 77
fi

# Copies whose ExecStart names this build's binaries: verify checks that
# the program exists and is executable.
for d in dispatcher worker; do
  sed "s#^ExecStart=/usr/local/bin/ferry-$d #ExecStart=${bin[$d]} #" \
    "$units/ferry-$d.service" > "$tmp/ferry-$d.service"
done
cd "$tmp"
out=$(systemd-analyze verify --man=no "$tmp/ferry-dispatcher.service" \
        "$tmp/ferry-worker.service" 2>&1) || {
  echo "FAIL systemd-analyze verify exited non-zero:"; echo "$out"; exit 1; }
ours=$(grep -E "ferry-(dispatcher|worker)|$tmp" <<<"$out" || true)
if [ -n "$ours" ]; then
  echo "FAIL systemd-analyze verify warns about our units:"; echo "$ours"; exit 1
fi
[ -z "$out" ] || { echo "(systemd-analyze verify, about other units:)"; echo "$out"; }
echo "ok   systemd-analyze verify: no warning about ferry-dispatcher.service or ferry-worker.service"

for d in dispatcher worker; do
  if ! sec=$(systemd-analyze security --offline=yes --threshold=20 \
               "$tmp/ferry-$d.service" 2>&1); then
    echo "FAIL ferry-$d.service: exposure above 2.0:"; echo "$sec"; exit 1
  fi
  echo "ok   $(grep -o 'Overall exposure level.*' <<<"$sec")"
done
