#!/usr/bin/env bash
# Installs every Debian 12 package Ferry's build, tests and benchmarks need.
# Run as root; non-interactive and idempotent (a second run installs
# nothing). CUDA is not a Debian package: the build uses nvcc when it finds
# one (/usr/local/cuda) and builds the CPU path alone otherwise.
#
#   install-deps.sh                everything the tests and benchmarks need
#   install-deps.sh --build-only   building the programs and libferry (the
#                                  container's build stage)
#   install-deps.sh --demo         --build-only plus Criterion, which the
#                                  configure with the tests on (deploy/demo.sh
#                                  builds tests/bench's bench_jpeg_crop) needs
#   install-deps.sh --python       --build-only plus what `pip install
#                                  ./client/python` builds with (docs/PYTHON.md)
#   FERRY_APT_LOCK_TIMEOUT=S       how long to wait for another apt or dpkg
#                                  holding its lock (300 s), then fail
#
# Debian's prometheus package starts and enables prometheus.service on
# :9090, where deploy/systemd/dispatcher.env's example serves Ferry's
# metrics; the tests run their own Prometheus, so when this script
# installs the package it stops and disables that service (re-enable:
# systemctl enable --now prometheus, after moving one of the two ports).
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
  # tests/python/test_mpirun.py launches ranks with Open MPI's mpirun, which
  # sets the OMPI_COMM_WORLD_RANK/SIZE that ferry.Client reads (Horovod has
  # no wheel in the registries, only an sdist built against a framework).
  openmpi-bin
  # tests/deploy: the container image built for real, its Debian 12 base,
  # a podman network with DNS (netavark runs iptables); runc where crun
  # refuses a hybrid cgroup layout; yamllint for deploy/k8s.
  podman buildah debootstrap netavark aardvark-dns uidmap iptables runc
  yamllint
  # tests/integration/partitions: hosts in network namespaces joined by a
  # bridge (ip), cut apart by iptables rules inside them.
  iproute2
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
case "${1:-}" in
  "") ;;
  --build-only) packages=("${build_only[@]}") ;;
  --demo) packages=("${build_only[@]}" libcriterion-dev) ;;
  --python) packages=("${build_only[@]}" python3 python3-venv python3-dev ninja-build) ;;
  *) echo "usage: deploy/install-deps.sh [--build-only | --demo | --python]" >&2; exit 2 ;;
esac

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
lock_timeout=${FERRY_APT_LOCK_TIMEOUT:-300}
deadline=$((SECONDS + lock_timeout))
prometheus_was_installed=0
if dpkg-query -W -f='${Status}' prometheus 2>/dev/null | grep -q 'install ok installed'; then
  prometheus_was_installed=1
fi

# apt_wait ARGS...: apt-get ARGS, waiting for another apt or dpkg (an
# unattended upgrade, a second install-deps) to release its lock: apt-get
# waits DPkg::Lock::Timeout for dpkg's frontend lock itself, and its other
# locks (the package lists', the archives') are retried every 5 s; both
# until FERRY_APT_LOCK_TIMEOUT from the start of this script.
apt_wait() {
  local err rc left
  err=$(mktemp)
  while :; do
    left=$((deadline - SECONDS))
    [ "$left" -gt 0 ] || left=1
    rc=0
    apt-get -o DPkg::Lock::Timeout="$left" "$@" 2>"$err" || rc=$?
    cat "$err" >&2
    [ "$rc" -ne 0 ] || { rm -f "$err"; return 0; }
    if ! grep -qiE 'could not get lock|unable to (acquire|lock)' "$err"; then
      rm -f "$err"
      echo "install-deps: FAIL: apt-get $* exited $rc (above)" >&2
      return "$rc"
    fi
    if [ "$SECONDS" -ge "$deadline" ]; then
      rm -f "$err"
      echo "install-deps: FAIL: another apt or dpkg still holds its lock" \
        "after ${lock_timeout} s (FERRY_APT_LOCK_TIMEOUT); see above for" \
        "which process, let it finish and run this again" >&2
      return 1
    fi
    echo "install-deps: another apt or dpkg holds its lock; retrying in 5 s" \
      "($((deadline - SECONDS)) s left of FERRY_APT_LOCK_TIMEOUT=${lock_timeout})" >&2
    sleep 5
  done
}

echo "install-deps: (waits up to ${lock_timeout} s for another apt or dpkg" \
  "holding its lock: FERRY_APT_LOCK_TIMEOUT)"
apt_wait update -q
apt_wait install -y -q --no-install-recommends "${missing[@]}"

# Newly installed prometheus: its service would hold :9090 (see the top).
if [ "$prometheus_was_installed" = 0 ] &&
    dpkg-query -W -f='${Status}' prometheus 2>/dev/null | grep -q 'install ok installed'; then
  # --now stops it where systemd runs; in a chroot or container it only
  # removes the enablement.
  systemctl disable --now prometheus.service >/dev/null 2>&1 || true
  echo "install-deps: stopped and disabled prometheus.service (Debian starts" \
    "it on :9090, the example metrics port of deploy/systemd; the tests run" \
    "their own Prometheus)"
fi
