#!/usr/bin/env bash
# debian_base.sh's mirror detection on the forms /etc/apt takes: deb822
# only (a stock Debian 12 image has only sources.list.d/debian.sources and
# no sources.list: the old script exited 2 there, silently), one-line
# sources.list (with [options]), *.list files, both, and none.
set -euo pipefail
root=$(cd "$(dirname "$0")/../.." && pwd)
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
fail=0
case_() { # NAME WANT: /etc/apt is $work/NAME
  local got rc=0
  got=$(FERRY_APT_ETC=$work/$1 timeout 10 bash "$root/tests/deploy/debian_base.sh" \
    --print-mirror 2>&1) || rc=$?
  if [ "$rc" -eq 0 ] && [ "$got" = "$2" ]; then
    echo "ok: $1: '${got}'"
  else
    echo "FAIL: $1: exit $rc, printed '$got', want '$2'"
    fail=1
  fi
}
mkdir -p "$work"/{deb822,oneline,dotlist,both,none,security-only}/sources.list.d
cat >"$work/deb822/sources.list.d/debian.sources" <<'X'
Types: deb
# http://snapshot.debian.org/archive/debian/20250520T000000Z
URIs: http://mirror.example/debian
Suites: bookworm bookworm-updates
Components: main
Signed-By: /usr/share/keyrings/debian-archive-keyring.gpg

Types: deb
URIs: http://mirror.example/debian-security
Suites: bookworm-security
Components: main
X
echo 'deb [arch=amd64 signed-by=/k.gpg] https://one.example/debian bookworm main' \
  >"$work/oneline/sources.list"
echo 'deb http://list.example/debian/ bookworm main' \
  >"$work/dotlist/sources.list.d/mirror.list"
cp "$work/deb822/sources.list.d/debian.sources" "$work/both/sources.list.d/"
cp "$work/oneline/sources.list" "$work/both/"
echo 'deb http://security.example/debian-security bookworm-security main' \
  >"$work/security-only/sources.list"
case_ deb822 http://mirror.example/debian
case_ oneline https://one.example/debian
case_ dotlist http://list.example/debian/
case_ both http://mirror.example/debian
case_ none ""
case_ security-only ""
[ "$fail" -eq 0 ] && echo "debian_base mirror: all cases passed"
exit "$fail"
