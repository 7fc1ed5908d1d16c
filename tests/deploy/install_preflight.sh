#!/usr/bin/env bash
# `cmake --install` of a build tree where libferry was not built (the tree
# deploy/demo.sh left before it built the install set: the daemons and
# ferryctl, no libferry) must fail before copying anything, naming what
# is missing and how to build it; it used to install the daemons, then
# fail on libferry.so, leaving a partial install. A fresh configure
# (no build: the programs are stand-in files), ~10-20 s.
set -euo pipefail
root=$(cd "$(dirname "$0")/../.." && pwd)
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
if ! cmake -S "$root" -B "$work/build" -DCMAKE_BUILD_TYPE=Release \
    -DFERRY_BUILD_TESTS=OFF -DFERRY_WITH_CUDA=OFF >"$work/cfg.log" 2>&1; then
  tail -n 20 "$work/cfg.log"
  echo "FAIL: cmake could not configure a fresh tree"
  exit 1
fi
for f in dispatcher/ferry-dispatcher worker/ferry-worker client/ctl/ferryctl; do
  printf '#!/bin/sh\n' >"$work/build/$f"
  chmod +x "$work/build/$f"
done
rc=0
timeout 60 cmake --install "$work/build" --prefix "$work/prefix" >"$work/out" 2>&1 || rc=$?
fail=0
if [ "$rc" -ne 0 ] && grep -q "not built, so nothing was installed" "$work/out" &&
    grep -q "libferry.so" "$work/out" && grep -q "cmake --build" "$work/out"; then
  echo "ok: cmake --install failed at once (exit $rc):"
  sed 's/^/  | /' "$work/out"
else
  echo "FAIL: cmake --install exited $rc without naming libferry and the build command:"
  sed 's/^/  | /' "$work/out"
  fail=1
fi
left=$(find "$work/prefix" -type f 2>/dev/null || true)
if [ -z "$left" ]; then
  echo "ok: nothing installed"
else
  echo "FAIL: a partial install was left behind:"
  echo "$left" | sed "s|^$work/prefix|  |"
  fail=1
fi
exit "$fail"
