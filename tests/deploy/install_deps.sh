#!/usr/bin/env bash
# deploy/install-deps.sh against stub apt-get, dpkg-query and systemctl
# (nothing is installed): it waits for another apt holding its lock and
# says so, gives up after FERRY_APT_LOCK_TIMEOUT with a clear message,
# fails at once on any other apt error, and --build-only / --demo / --python ask
# for no test toolchain (torch, podman, prometheus); when the full set
# installs Debian's prometheus it stops and disables prometheus.service
# (which would hold :9090) and says so, and it leaves alone a prometheus
# that was installed before it ran. Skips (77) when not root
# (install-deps.sh would sudo).
set -euo pipefail
root=$(cd "$(dirname "$0")/../.." && pwd)
[ "$(id -u)" -eq 0 ] || { echo "SKIP: install-deps.sh runs as root"; exit 77; }
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
mkdir "$work/bin"
# dpkg-query -W -f='${Status}' PKG: "install ok installed" for the
# packages listed in $work/installed (one a line; each run starts with
# $work/preinstalled's), else not installed. apt-get: logs its arguments;
# `update` fails with apt's lock message while $work/locked-updates > 0
# (counting down), or with another error when $work/broken exists;
# `install` adds its packages to $work/installed.
cat >"$work/bin/dpkg-query" <<X
#!/bin/bash
pkg=\${!#}
if grep -qxF -- "\$pkg" "$work/installed" 2>/dev/null; then
  printf 'install ok installed'; exit 0
fi
echo "dpkg-query: no packages found matching \$pkg" >&2
exit 1
X
cat >"$work/bin/apt-get" <<X
#!/bin/bash
echo "\$*" >>"$work/apt.log"
if [ -e "$work/broken" ]; then echo "E: The repository is broken" >&2; exit 100; fi
if [ "\$3" = update ] && n=\$(cat "$work/locked-updates") && [ "\$n" -gt 0 ]; then
  echo \$((n - 1)) >"$work/locked-updates"
  echo "E: Could not get lock /var/lib/apt/lists/lock. It is held by process 4242 (apt-get)" >&2
  exit 100
fi
if [ "\$3" = install ]; then
  for a in "\${@:4}"; do
    case \$a in -*) ;; *) echo "\$a" >>"$work/installed" ;; esac
  done
fi
exit 0
X
printf '#!/bin/sh\necho "$*" >>"%s/systemctl.log"\n' "$work" >"$work/bin/systemctl"
chmod +x "$work/bin/"*
fail=0
: >"$work/preinstalled"
run() { # NAME WANT_RC PATTERN-IN-OUTPUT ARGS...
  local name=$1 want=$2 pat=$3 rc=0 t0=$SECONDS
  shift 3
  : >"$work/apt.log"
  : >"$work/systemctl.log"
  cp "$work/preinstalled" "$work/installed"
  PATH=$work/bin:$PATH timeout 60 "$root/deploy/install-deps.sh" "$@" \
    >"$work/out" 2>&1 || rc=$?
  if [ "$rc" = "$want" ] && grep -qE -- "$pat" "$work/out"; then
    echo "ok: $name: exit $rc in $((SECONDS - t0)) s"
  else
    echo "FAIL: $name: exit $rc (want $want), output (want /$pat/):"
    sed 's/^/  | /' "$work/out"
    fail=1
  fi
}
echo 2 >"$work/locked-updates"
FERRY_APT_LOCK_TIMEOUT=60 run "waits for the lock" 0 \
  'holds its lock; retrying in 5 s' --build-only
if [ "$(grep -c ' update' "$work/apt.log")" = 3 ] &&
    grep -q -- '-o DPkg::Lock::Timeout=[0-9]* install ' "$work/apt.log"; then
  echo "ok: update tried 3 times, install with DPkg::Lock::Timeout"
else
  echo "FAIL: apt-get calls:"; sed 's/^/  | /' "$work/apt.log"; fail=1
fi
echo 1000 >"$work/locked-updates"
FERRY_APT_LOCK_TIMEOUT=6 run "gives up after FERRY_APT_LOCK_TIMEOUT" 1 \
  'still holds its lock after 6 s' --build-only
echo 0 >"$work/locked-updates"
touch "$work/broken"
run "another apt error fails at once" 100 'FAIL: apt-get update -q exited 100'
rm "$work/broken"
# no_prometheus_touched NAME: install-deps.sh neither called systemctl nor
# said it stopped prometheus.service.
no_prometheus_touched() {
  if [ -s "$work/systemctl.log" ] || grep -q 'prometheus.service' "$work/out"; then
    echo "FAIL: $1: prometheus.service touched: systemctl $(cat "$work/systemctl.log")"
    sed 's/^/  | /' "$work/out"
    fail=1
  else
    echo "ok: $1: no systemctl call"
  fi
}
for set in --build-only --demo --python; do
  run "install-deps.sh $set" 0 'installing' "$set"
  if grep -qE ' (python3-torch|podman|prometheus|buildah)( |$)' "$work/apt.log"; then
    echo "FAIL: $set installs the test toolchain: $(grep install "$work/apt.log")"
    fail=1
  else
    echo "ok: $set: $(grep -o 'install .*' "$work/apt.log" | wc -w) words, no test toolchain"
  fi
  no_prometheus_touched "$set"
done
# The full set installs prometheus: Debian would start and enable its
# service on :9090, so install-deps.sh stops and disables it, once.
run "the full set installs prometheus" 0 \
  '^install-deps: stopped and disabled prometheus.service \(Debian starts it on :9090'
if grep -qE ' install .* prometheus( |$)' "$work/apt.log" &&
    [ "$(cat "$work/systemctl.log")" = "disable --now prometheus.service" ]; then
  echo "ok: the full set: systemctl disable --now prometheus.service"
else
  echo "FAIL: the full set: want one 'systemctl disable --now prometheus.service'" \
    "after installing prometheus; systemctl calls:"
  sed 's/^/  | /' "$work/systemctl.log"
  echo "  apt-get calls:"; sed 's/^/  | /' "$work/apt.log"
  fail=1
fi
# A prometheus installed before install-deps.sh ran is the operator's:
# left running and enabled, though other packages are installed.
echo prometheus >"$work/preinstalled"
run "the full set with prometheus already installed" 0 'installing'
if grep -qE ' install .* prometheus( |$)' "$work/apt.log"; then
  echo "FAIL: prometheus was installed already, yet asked for: $(grep install "$work/apt.log")"
  fail=1
fi
no_prometheus_touched "prometheus already installed"
: >"$work/preinstalled"
# Nothing missing: nothing installed, nothing stopped.
sort -u "$work/installed" >"$work/preinstalled"
run "everything present" 0 '^install-deps: all [0-9]+ packages present'
[ ! -s "$work/apt.log" ] || { echo "FAIL: apt-get ran: $(cat "$work/apt.log")"; fail=1; }
no_prometheus_touched "everything present"
: >"$work/preinstalled"
run "unknown option" 2 'usage:' --bogus
[ "$fail" -eq 0 ] && echo "install-deps: all checks passed"
exit "$fail"
