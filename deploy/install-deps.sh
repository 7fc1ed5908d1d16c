#!/usr/bin/env bash
# Installs every Debian 12 package Ferry's build, tests and benchmarks need.
# Run as root; non-interactive and idempotent (a second run installs
# nothing). CUDA is not a Debian package: the build uses nvcc when it finds
# one (/usr/local/cuda) and builds the CPU path alone otherwise.
set -euo pipefail

packages=(
  build-essential cmake pkg-config git
  libgrpc-dev libprotobuf-c-dev protobuf-c-compiler protobuf-compiler
  libuv1-dev libturbojpeg0-dev libjpeg-dev libucx-dev libcriterion-dev zlib1g-dev
  clang libclang-rt-14-dev          # libFuzzer and sanitizer runtimes
  python3 python3-venv python3-grpcio  # interop tests
  # The Python suite (tests/python): its venv sees these through
  # --system-site-packages (the registry's torch wheel is gigabytes of CUDA).
  python3-torch python3-numpy python3-pytest
  python3-dev ninja-build    # building the ferry package (client/python)
  # unit/test_crop checks the resampler against the real torchvision, and
  # tests/bench/imagenet.sh runs the seeds' PyTorch DataLoader path.
  python3-torchvision python3-pil
  # tests/deploy: the container image built for real, its Debian 12 base,
  # a podman network with DNS (netavark runs iptables); runc where crun
  # refuses a hybrid cgroup layout; yamllint for deploy/k8s.
  podman buildah debootstrap netavark aardvark-dns uidmap iptables runc
  yamllint
  # sd_notify in the daemons; systemd-analyze verify for deploy/systemd.
  libsystemd-dev systemd
  # The daemons' /metrics server; promtool and a real Prometheus for
  # tests/integration/metrics*.sh.
  libmicrohttpd-dev prometheus curl
)

# --build-only: what building the programs needs and no more (the build
# stage of deploy/container/Containerfile).
build_only=(
  build-essential cmake pkg-config
  libgrpc-dev libprotobuf-c-dev protobuf-c-compiler protobuf-compiler
  libuv1-dev libturbojpeg0-dev libjpeg-dev libucx-dev zlib1g-dev
  libsystemd-dev libmicrohttpd-dev
)
if [ "${1:-}" = --build-only ]; then
  packages=("${build_only[@]}")
fi

if [ "$(id -u)" -ne 0 ]; then
  if command -v sudo >/dev/null 2>&1; then
    exec sudo -E "$0" "$@"
  fi
  echo "install-deps.sh: run as root (or install sudo)" >&2
  exit 1
fi

missing=()
for p in "${packages[@]}"; do
  if ! dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q 'install ok installed'; then
    missing+=("$p")
  fi
done

if [ ${#missing[@]} -eq 0 ]; then
  echo "install-deps: all ${#packages[@]} packages present"
  exit 0
fi

echo "install-deps: installing ${missing[*]}"
export DEBIAN_FRONTEND=noninteractive
apt-get update -q
apt-get install -y -q --no-install-recommends "${missing[@]}"
