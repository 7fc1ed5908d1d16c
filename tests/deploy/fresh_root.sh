#!/usr/bin/env bash
# What a new user meets on a fresh Debian 12 machine, on a fresh Debian 12
# root rather than this configured machine: the debootstrap minbase that
# debian_base.sh caches (~/.cache/ferry), with its apt sources in deb822
# form as a stock image has them (sources.list.d/debian.sources, no
# sources.list), in a chroot of its own (mount and pid namespaces: its
# mounts and processes end with it). In it, from a clean clone of this
# repository's HEAD (committed work only; a copy of the sources when they
# are not a git checkout), as root, the documented steps:
#   1. the README's quick start, `deploy/demo.sh` (small: 2000 records,
#      1 epoch, no one-process benchmark): installs its packages, builds,
#      runs the local cluster;
#   2. the README's install recipe: `cmake --install build-release
#      --prefix /usr/local`, `ldconfig`, the daemons on PATH; a tiny C
#      program built with `pkg-config --cflags --libs ferry` runs against
#      the installed libferry; the same with `--prefix /opt/ferry` and an
#      rpath instead of ldconfig;
#   3. docs/PYTHON.md's install: `deploy/install-deps.sh --python`, a venv,
#      `pip install ./client/python`, `import ferry`, ferry.version().
# Each step's time is printed. Skips (77), saying why, without root,
# unshare, chroot or the base (debootstrap, podman). Needs the network
# to the Debian mirror apt uses here and to PyPI (scikit-build-core).
# Measured on a shared 2-core machine (load 7-12 from other builds): 281 s
# in all with apt's downloads cached (the demo 202 s: apt and the build;
# the install recipes 1 s; the Python package 76 s); the first run, which
# downloads, spent 292 s in the demo.
set -euo pipefail
root=$(cd "$(dirname "$0")/../.." && pwd)
cache=${FERRY_CACHE_DIR:-$HOME/.cache/ferry}
base_tar=$cache/debian-bookworm-minbase.tar

skip() { echo "SKIP: $*"; exit 77; }
[ "$(id -u)" -eq 0 ] || skip "needs root (chroot, mounts, apt in the root)"
for tool in unshare chroot tar mount; do
  command -v "$tool" >/dev/null || skip "$tool is not installed"
done
rc=0
"$root/tests/deploy/debian_base.sh" || rc=$?
[ "$rc" -eq 0 ] || exit "$rc"  # 77 with debian_base.sh's reason
[ -s "$base_tar" ] || skip "no Debian 12 base tarball at $base_tar"
unshare --mount --pid --fork --kill-child true 2>/dev/null ||
  skip "unshare cannot make mount and pid namespaces here"

work=$(mktemp -d /var/tmp/ferry-fresh-root.XXXXXX)
r=$work/root
cleanup() {
  # The root's mounts live in the namespace unshare made and are gone
  # with it; never delete through a mount that is still there.
  if findmnt -rn -o TARGET | grep -q "^$r/"; then
    echo "FAIL: mounts left under $r; not removing $work"
    return
  fi
  rm -rf "$work"
}
trap cleanup EXIT
t0=$SECONDS
mkdir "$r"
tar -C "$r" -xf "$base_tar"

# apt sources as a stock Debian 12 image has them: deb822 only. This
# machine's own debian.sources when it has one (the mirror CI reaches),
# else one made from the mirror debian_base.sh finds.
rm -f "$r/etc/apt/sources.list"
if [ -s /etc/apt/sources.list.d/debian.sources ]; then
  cp /etc/apt/sources.list.d/debian.sources "$r/etc/apt/sources.list.d/"
else
  mirror=$("$root/tests/deploy/debian_base.sh" --print-mirror)
  mirror=${mirror:-http://deb.debian.org/debian}
  cat >"$r/etc/apt/sources.list.d/debian.sources" <<EOF
Types: deb
URIs: $mirror
Suites: bookworm bookworm-updates
Components: main
Signed-By: /usr/share/keyrings/debian-archive-keyring.gpg
EOF
fi
cp -L /etc/resolv.conf "$r/etc/resolv.conf"
# pip's settings of this machine (PIP_* variables, /etc/pip.conf) and the
# CA bundle its pip trusts (a proxy's CA, where there is one), copied to
# /root/pip-ca.crt: the root's own /etc/ssl/certs bundle is rewritten when
# the ca-certificates package is installed there. Without any, pip uses
# its own CA bundle, as on a plain machine.
pip_env=()
while IFS= read -r v; do pip_env+=("$v"); done < <(env | grep -E '^PIP_[A-Z_]+=' | grep -v '^PIP_CERT=' || true)
[ ! -f /etc/pip.conf ] || cp -L /etc/pip.conf "$r/etc/pip.conf"
ca=${PIP_CERT:-${SSL_CERT_FILE:-$(sed -n 's/^cert[[:space:]]*=[[:space:]]*//p' /etc/pip.conf 2>/dev/null | head -n 1)}}
if [ -n "$ca" ] && [ -f "$ca" ]; then
  cp -L "$ca" "$r/root/pip-ca.crt"
  pip_env+=(PIP_CERT=/root/pip-ca.crt)
fi
# apt's downloads are kept across runs in the cache (a rerun fetches
# nothing; CI's fresh machine fetches them once).
apt_cache=$cache/fresh-root-apt
mkdir -p "$apt_cache/partial"
find_links=${PIP_FIND_LINKS:-}
if [ -n "$find_links" ] && [ -d "$find_links" ]; then
  mkdir -p "$r$find_links"
else
  find_links=
fi

# A clean clone of HEAD; sources that are not a git checkout are copied
# without their build trees.
if command -v git >/dev/null && git -C "$root" rev-parse HEAD >/dev/null 2>&1; then
  git clone -q "$root" "$r/root/ferry"
  what="a clone of $(git -C "$root" rev-parse --short HEAD)"
else
  mkdir "$r/root/ferry"
  tar -C "$root" --exclude='./build*' --exclude='./.venv' \
    --exclude='./client/python/build*' -cf - . | tar -C "$r/root/ferry" -xf -
  what="a copy of $root (not a git checkout; build trees left out)"
fi
echo "fresh root: $r (Debian 12 minbase, deb822 sources only), $what;" \
  "$((SECONDS - t0)) s"

# The steps, as root in the fresh root, in /root/ferry.
cat >"$r/root/steps.sh" <<'EOF'
set -euo pipefail
cd /root/ferry
start=$SECONDS
step() { echo; echo "==== fresh root: $* ($((SECONDS - start)) s)"; }
fail() { echo "FAIL: $*"; exit 1; }

step "1. deploy/demo.sh (the README's quick start; small settings)"
FERRY_DEMO_RECORDS=2000 FERRY_DEMO_EPOCHS=1 FERRY_DEMO_SKIP_BENCH=1 \
  deploy/demo.sh >/root/demo.log 2>&1 || {
    rc=$?; tail -n 40 /root/demo.log; fail "deploy/demo.sh exited $rc"; }
grep -E "^end of epoch|^== |all [0-9]+ processes" /root/demo.log || true
grep -q "end of epoch: 2000 records" /root/demo.log ||
  { tail -n 30 /root/demo.log; fail "the demo's trainer did not get 2000 records"; }
for p in prometheus podman python3-torch; do
  if dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q 'ok installed'; then
    fail "the demo installed $p, which it does not use"
  fi
done
echo "ok: the demo ran and installed no test toolchain"

step "2. cmake --install build-release --prefix /usr/local; ldconfig"
cmake --install build-release --prefix /usr/local >/root/install.log 2>&1 ||
  { cat /root/install.log; fail "cmake --install of the demo's tree failed"; }
ldconfig
for d in ferry-dispatcher ferry-worker ferryctl; do
  command -v "$d" >/dev/null || fail "$d is not on PATH after the install"
  echo "ok: $($d --version) ($(command -v "$d"))"
done
cat >/root/hello.c <<'C'
#include <stdio.h>
#include <string.h>
#include <ferry/client.h>
int main(void) {
  ferry_client_options_t o;
  ferry_client_options_init(&o);
  printf("libferry %s (headers %s)\n", ferry_version(), FERRY_VERSION_STRING);
  return strcmp(ferry_version(), FERRY_VERSION_STRING) != 0;
}
C
echo "pkg-config --cflags --libs ferry: $(pkg-config --cflags --libs ferry)"
# shellcheck disable=SC2046
cc -o /root/hello /root/hello.c $(pkg-config --cflags --libs ferry) ||
  fail "the program did not build against the installed libferry"
/root/hello || fail "the program did not run against the installed libferry"
echo "ok: a program built with pkg-config runs (the library found through ldconfig)"

step "2b. cmake --install --prefix /opt/ferry, with an rpath instead of ldconfig"
cmake --install build-release --prefix /opt/ferry >/dev/null
export PKG_CONFIG_PATH=/opt/ferry/lib/pkgconfig
libdir=$(pkg-config --variable=libdir ferry)
# shellcheck disable=SC2046
cc -o /root/hello-rpath /root/hello.c $(pkg-config --cflags --libs ferry) \
  -Wl,-rpath,"$libdir"
unset PKG_CONFIG_PATH
ldd /root/hello-rpath >/root/ldd.txt
grep -q "libferry.so.0 => /opt/ferry/" /root/ldd.txt ||
  { cat /root/ldd.txt; fail "the rpath build does not load /opt/ferry's libferry"; }
/root/hello-rpath
echo "ok: with -Wl,-rpath,$libdir"

step "3. the Python package (docs/PYTHON.md)"
deploy/install-deps.sh --python >/root/deps-python.log 2>&1 ||
  { tail -n 20 /root/deps-python.log; fail "install-deps.sh --python"; }
/usr/bin/python3 -m venv --system-site-packages .venv
.venv/bin/pip install -q ./client/python >/root/pip.log 2>&1 ||
  { tail -n 40 /root/pip.log; fail "pip install ./client/python"; }
v=$(cd / && /root/ferry/.venv/bin/python -c 'import ferry; print(ferry.version())')
[ "$v" = "$(ferry-dispatcher --version | awk '{print $2}')" ] ||
  fail "ferry.version() is '$v'"
echo "ok: import ferry; ferry.version() = $v"
step "done"
EOF

# PID 1 of the new pid namespace is this bash: when it ends (or is
# killed: --kill-child), every process of the root goes with it.
rc=0
# shellcheck disable=SC2016
env -i PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin \
  HOME=/root LANG=C.UTF-8 TERM=dumb "${pip_env[@]}" \
  R="$r" FIND_LINKS="$find_links" APT_CACHE="$apt_cache" \
  unshare --mount --pid --fork --kill-child bash -c '
    set -euo pipefail
    mount -t proc proc "$R/proc"
    mount --rbind /dev "$R/dev"
    mount -t sysfs sysfs "$R/sys"
    mount -t tmpfs tmpfs "$R/tmp"
    mount --bind "$APT_CACHE" "$R/var/cache/apt/archives"
    if [ -n "$FIND_LINKS" ]; then mount --bind -o ro "$FIND_LINKS" "$R$FIND_LINKS"; fi
    exec chroot "$R" /bin/bash /root/steps.sh' || rc=$?
echo "fresh root: $((SECONDS - t0)) s in all"
[ "$rc" -eq 0 ] && echo "fresh root: all steps passed"
exit "$rc"
