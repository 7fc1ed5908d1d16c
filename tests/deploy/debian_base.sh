#!/usr/bin/env bash
# Makes the Debian 12 base image of the podman tests,
# localhost/ferry-debian:bookworm: a debootstrap minbase (Debian's
# packages; the registry's debian image is not reachable from CI), its
# tarball cached as ~/.cache/ferry/debian-bookworm-minbase.tar so later
# runs only `podman import` it (seconds; debootstrap takes ~80 s).
# Used by container.sh and systemd_podman.sh (a ctest fixture). Idempotent;
# skips (77) without root, podman or debootstrap.
set -euo pipefail
cache=${FERRY_CACHE_DIR:-$HOME/.cache/ferry}
base_tar=$cache/debian-bookworm-minbase.tar
base_img=${FERRY_DEBIAN_IMAGE:-localhost/ferry-debian:bookworm}

skip() { echo "SKIP: $*"; exit 77; }
for tool in podman debootstrap; do
  command -v "$tool" >/dev/null ||
    skip "$tool is not installed (deploy/install-deps.sh installs it)"
done
[ "$(id -u)" -eq 0 ] || skip "debootstrap needs root"

mkdir -p "$cache"
exec 9>"$base_tar.lock"
flock 9
if [ ! -s "$base_tar" ]; then
  work=$(mktemp -d)
  trap 'rm -rf "$work"' EXIT
  echo "debootstrap: a Debian 12 minbase into $base_tar"
  t0=$SECONDS
  # The mirror apt itself uses (a CI machine may only reach its own), else
  # deb.debian.org; FERRY_DEBIAN_MIRROR overrides both.
  mirror=${FERRY_DEBIAN_MIRROR:-$(
    { sed -n 's/^URIs:[[:space:]]*//p' /etc/apt/sources.list.d/*.sources
      sed -n 's/^deb[[:space:]]\{1,\}\(\[[^]]*\][[:space:]]*\)\{0,1\}\([^[:space:]]*\).*/\2/p' \
        /etc/apt/sources.list; } 2>/dev/null |
      tr ' ' '\n' | grep -E '^https?://.*/debian/?$' | head -n 1)}
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
