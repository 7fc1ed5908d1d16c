#!/usr/bin/env bash
# Makes the Debian 12 base image of the podman tests,
# localhost/ferry-debian:bookworm: a debootstrap minbase (Debian's
# packages; the registry's debian image is not reachable from CI), its
# tarball cached as ~/.cache/ferry/debian-bookworm-minbase.tar so later
# runs only `podman import` it (seconds; debootstrap takes ~80 s).
# Used by container.sh and systemd_podman.sh (a ctest fixture). Idempotent;
# skips (77) without root, podman or debootstrap.
#   debian_base.sh --print-mirror   prints the mirror it would use
set -euo pipefail
cache=${FERRY_CACHE_DIR:-$HOME/.cache/ferry}
base_tar=$cache/debian-bookworm-minbase.tar
base_img=${FERRY_DEBIAN_IMAGE:-localhost/ferry-debian:bookworm}

skip() { echo "SKIP: $*"; exit 77; }
# Any other failure says where it happened (set -e alone exits silently).
trap 'echo "FAIL: debian_base.sh line $LINENO: \"$BASH_COMMAND\" exited $?" >&2' ERR

# apt_mirror: the first Debian mirror apt itself uses (a CI machine may
# reach only its own), from deb822 files (sources.list.d/*.sources: the
# only form a stock Debian 12 image has) and one-line ones
# (sources.list, sources.list.d/*.list), whichever exist; prints nothing
# when none names one. FERRY_APT_ETC: another /etc/apt (tests).
apt_mirror() {
  local etc=${FERRY_APT_ETC:-/etc/apt} f
  {
    for f in "$etc"/sources.list.d/*.sources; do
      if [ -r "$f" ]; then sed -n 's/^URIs:[[:space:]]*//p' "$f"; fi
    done
    for f in "$etc"/sources.list "$etc"/sources.list.d/*.list; do
      if [ -r "$f" ]; then
        sed -n 's/^deb[[:space:]]\{1,\}\(\[[^]]*\][[:space:]]*\)\{0,1\}\([^[:space:]]*\).*/\2/p' "$f"
      fi
    done
  } | tr ' \t' '\n\n' | awk '/^https?:\/\/.*\/debian\/?$/ { print; exit }' || true
}
if [ "${1:-}" = --print-mirror ]; then apt_mirror; exit 0; fi

for tool in podman debootstrap; do
  command -v "$tool" >/dev/null ||
    skip "$tool is not installed (deploy/install-deps.sh installs it)"
done
[ "$(id -u)" -eq 0 ] || skip "debootstrap needs root"

mkdir -p "$cache"
exec 9>"$base_tar.lock"
# Another run making the base (debootstrap: ~80 s): wait for it, bounded.
if ! flock -w 600 9; then
  echo "FAIL: $base_tar.lock held for 600 s by another run (lsof $base_tar.lock)"
  exit 1
fi
if [ ! -s "$base_tar" ]; then
  work=$(mktemp -d)
  trap 'rm -rf "$work"' EXIT
  echo "debootstrap: a Debian 12 minbase into $base_tar"
  t0=$SECONDS
  mirror=${FERRY_DEBIAN_MIRROR:-$(apt_mirror)}
  mirror=${mirror:-http://deb.debian.org/debian}
  echo "debootstrap: mirror $mirror"
  if ! debootstrap --variant=minbase bookworm "$work/rootfs" "$mirror" \
      >"$work/debootstrap.log" 2>&1; then
    tail -n 5 "$work/debootstrap.log"
    skip "debootstrap could not make the Debian 12 base (above)"
  fi
  tar -C "$work/rootfs" -cf "$base_tar.tmp" . && mv "$base_tar.tmp" "$base_tar"
  echo "debootstrap: $((SECONDS - t0)) s"
fi
if ! podman image exists "$base_img"; then
  if ! err=$(podman import -q "$base_tar" "$base_img" 2>&1); then
    skip "podman import of $base_tar failed: $err"
  fi
fi
echo "base image: $base_img ($(podman image inspect "$base_img" --format '{{.Size}}') bytes)"
