#!/usr/bin/env bash
# Builds deploy/container/Containerfile for real with podman, on a Debian 12
# base made with debootstrap (debian_base.sh; its tarball cached under
# ~/.cache/ferry), and runs it:
#   - ferry-worker, ferry-dispatcher and ferryctl --version in the image,
#     no shared library missing (ldd), the user is 10001, a HEALTHCHECK;
#   - a dispatcher, a worker and a trainer (ferry-example-trainer, the
#     trainer target) in containers on one podman network: the epoch
#     delivers every record, `ferryctl status --json` in a fourth container
#     lists the worker, both daemons' HEALTHCHECKs pass, SIGTERM (podman
#     stop) ends both with status 0; nothing is left behind.
# With FERRY_CONTAINER_GPU_RECIPE=1 also the trainer-gpu target's recipe
# on the Debian base with CUDA off, and an epoch through ferry.Client in it.
# Skips (77) with the error when podman, buildah or debootstrap is missing
# or podman cannot run a container on this machine.
# Measured on 2 cores: the base 30 to 80 s once (debootstrap), the image
# build 110 s from nothing (295 s while other builds shared the cores),
# the checks about 15 s; 75 s in all when only Ferry's sources changed
# and FERRY_CONTAINER_KEEP_CACHE=1 kept the build's images (by default
# every image the builds made is removed at the end).
# The trainer-gpu recipe adds 2.5 to 5 minutes.
set -euo pipefail
root=$(cd "$(dirname "$0")/../.." && pwd)
version=$(sed -n 's/^project(ferry VERSION \([0-9.]*\).*/\1/p' "$root/CMakeLists.txt")
base_img=${FERRY_DEBIAN_IMAGE:-localhost/ferry-debian:bookworm}
tag=ci-$$
img=localhost/ferry:$tag
trainer_img=localhost/ferry-trainer:$tag
gpu_img=localhost/ferry-trainer-gpu-recipe:$tag
label=ferry-test=container-$$
net=ferry-ci-$$
records=2000

skip() { echo "SKIP: $*"; exit 77; }
for tool in podman buildah debootstrap; do
  command -v "$tool" >/dev/null ||
    skip "$tool is not installed (deploy/install-deps.sh installs it)"
done
if [ "$(id -u)" -ne 0 ]; then
  skip "needs root: debootstrap, and rootful podman for the network"
fi

work=$(mktemp -d)
cleanup() {
  local ids
  ids=$(podman ps -aq --filter "label=$label" 2>/dev/null || true)
  # shellcheck disable=SC2086
  [ -z "$ids" ] || podman rm -f -t 0 $ids >/dev/null 2>&1 || true
  podman network rm -f "$net" >/dev/null 2>&1 || true
  podman rmi -f "$img" "$trainer_img" "$gpu_img" >/dev/null 2>&1 || true
  remove_build_images
  rm -rf "$work"
}
# remove_build_images: every image the builds above made or took from the
# layer cache, as their logs name them ("--> ID", "--> Using cache ID"):
# the build stage's (the compilers and Ferry's objects, ~940 MB) and each
# step's, which the rmi of the tags leaves dangling. Newest first (a
# parent goes once its children have); an image a container or another
# image still uses is left. FERRY_CONTAINER_KEEP_CACHE=1 keeps them, so
# that a rerun after a change to Ferry's sources only recompiles (75 s
# against 110 s from nothing).
remove_build_images() {
  local ids id n=0 before after
  [ "${FERRY_CONTAINER_KEEP_CACHE:-0}" != 1 ] || return 0
  ids=$(cat "$work"/build-*.log 2>/dev/null |
    sed -n 's/^--> \(Using cache \)\{0,1\}\([0-9a-f]\{10,64\}\)$/\2/p' | tac || true)
  [ -n "$ids" ] || return 0
  before=$(podman images -a -q | wc -l)
  for id in $ids; do
    # Only untagged ones: a tag (the base, another user's) keeps its image.
    if [ -z "$(podman image inspect --format '{{.RepoTags}}' "$id" 2>/dev/null |
               tr -d '[]')" ] && podman rmi "$id" >/dev/null 2>&1; then
      n=$((n + 1))
    fi
  done
  after=$(podman images -a -q | wc -l)
  echo "removed the builds' untagged images: $n named, $((before - after)) in all"
  build_images_left=""
  for id in $ids; do
    if podman image exists "$id" && [ -z "$(podman image inspect \
        --format '{{.RepoTags}}' "$id" 2>/dev/null | tr -d '[]')" ]; then
      build_images_left+="$id "
    fi
  done
}
build_images_left=""
trap cleanup EXIT

# ---- the Debian 12 base (debootstrap), cached --------------------------
rc=0
"$root/tests/deploy/debian_base.sh" || rc=$?
[ "$rc" -eq 0 ] || exit "$rc"

# ---- can podman run a container here? ----------------------------------
# Some sandboxes refuse what podman's defaults ask: crun refuses a hybrid
# cgroup v1/v2 layout with controllers on the v2 side, and without
# CAP_SYS_RESOURCE setting the container's RLIMIT_NOFILE/NPROC above what
# this process has fails. Then retry with runc and limits within ours.
if ! err=$(podman run --rm "$base_img" true 2>&1); then
  echo "podman run with the defaults failed: $err"
  nofile=$(ulimit -Hn)
  nproc=$(ulimit -Hu)
  [ "$nproc" = unlimited ] || [ "$nproc" -gt 4096 ] && nproc=4096
  cat >"$work/containers.conf" <<EOF
[containers]
default_ulimits = ["nofile=$nofile:$nofile", "nproc=$nproc:$nproc"]
[engine]
runtime = "$(command -v runc >/dev/null && echo runc || echo crun)"
EOF
  export CONTAINERS_CONF=$work/containers.conf
  echo "retrying with $CONTAINERS_CONF:"
  cat "$CONTAINERS_CONF"
  if ! err2=$(podman run --rm "$base_img" true 2>&1); then
    skip "podman cannot run a container on this machine: '$err', and" \
         "with runc and lower limits: '$err2'"
  fi
fi
if ! err=$(podman run --rm --network none "$base_img" true 2>&1); then
  skip "podman cannot run a container: $err"
fi

# ---- build ---------------------------------------------------------------
t0=$SECONDS
build() { # TARGET TAG [BUILD-ARG...]
  local target=$1 tag=$2
  shift 2
  # --jobs 2: the runtime stage's apt-get runs while the build stage
  # compiles.
  podman build --jobs 2 --format docker -f "$root/deploy/container/Containerfile" \
    --build-arg DEBIAN_IMAGE="$base_img" "$@" --target "$target" -t "$tag" \
    "$root" >"$work/build-$target.log" 2>&1 || {
      tail -n 30 "$work/build-$target.log"
      echo "FAIL: podman build --target $target"
      exit 1
    }
}
build runtime "$img"
build trainer "$trainer_img"
echo "image build: $((SECONDS - t0)) s; $(podman image inspect "$img" --format '{{.Size}}') bytes"
# With FERRY_CONTAINER_GPU_RECIPE=1 (ctest deploy/container-gpu-recipe):
# the trainer-gpu recipe (build-gpu, trainer-gpu) on the Debian base with
# CUDA off: NVIDIA's images are not reachable here and there is no GPU,
# but the packages, the Python package's build (scikit-build-core from
# PyPI), the copied libraries and the venv are the same steps.
# pip in the build trusts what this machine's pip trusts (a proxy's CA).
ca=${PIP_CERT:-${SSL_CERT_FILE:-/etc/ssl/certs/ca-certificates.crt}}
pip_ca=()
if [ -f "$ca" ]; then
  pip_ca=(-v "$ca:/run/ferry-pip-ca.crt:ro" --build-arg PIP_CERT=/run/ferry-pip-ca.crt)
fi
if [ "${FERRY_CONTAINER_GPU_RECIPE:-0}" = 1 ]; then
  t0=$SECONDS
  build trainer-gpu "$gpu_img" "${pip_ca[@]}" --build-arg CUDA_DEVEL_IMAGE="$base_img" \
    --build-arg CUDA_RUNTIME_IMAGE="$base_img" --build-arg FERRY_WITH_CUDA=OFF
  echo "trainer-gpu recipe build: $((SECONDS - t0)) s"
fi

fail=0
check() { # DESCRIPTION GOT WANT
  if [ "$2" = "$3" ]; then
    echo "ok: $1"
  else
    echo "FAIL: $1: got '$2', want '$3'"
    fail=1
  fi
}
run() { podman run --rm --no-healthcheck --label "$label" "$@"; }

# ---- the image -----------------------------------------------------------
check "ferry-worker --version" "$(run "$img" ferry-worker --version)" "ferry-worker $version"
check "ferry-dispatcher --version" "$(run "$img" ferry-dispatcher --version)" "ferry-dispatcher $version"
check "ferryctl --version (role ctl)" "$(run "$img" ctl --version)" "ferryctl $version"
# shellcheck disable=SC2016  # $b expands in the container's bash
check "no missing library" "$(run "$img" bash -c \
  'for b in /usr/local/bin/ferry-dispatcher /usr/local/bin/ferry-worker /usr/local/bin/ferryctl; do ldd "$b" | grep "not found"; done')" ""
check "user" "$(run "$img" id -un):$(run "$img" id -u):$(run "$img" id -g)" "ferry:10001:10001"
check "no compiler in the runtime image" \
  "$(run "$img" bash -c 'command -v cc gcc cmake || true')" ""
check "HEALTHCHECK" "$(podman image inspect "$img" --format '{{json .Config.Healthcheck.Test}}')" \
  '["CMD","/usr/local/bin/ferry-healthcheck"]'
check "HEALTHCHECK where no daemon runs" \
  "$(run "$img" ferry-healthcheck 2>&1; echo "exit $?")" \
  "ferry-healthcheck: nothing accepts on 127.0.0.1:9090 (FERRY_METRICS_PORT; the daemon needs --metrics-port 9090)
exit 1"
check "no role" "$(run "$img" "" 2>&1 >/dev/null | head -c 25; true)" \
  "usage: ROLE [ARGS...]: RO"

# ---- a cluster on one podman network -------------------------------------
mkdir -p "$work/data"
chmod 0777 "$work/data"
run -v "$work/data:/data" "$img" ctl gen --out /data --records "$records" \
  --shards 4 >/dev/null
podman network create "$net" >/dev/null

# wait_log NAME PATTERN: the container's output has a line matching
# PATTERN (a bounded wait on `podman logs -f`, no polling).
wait_log() {
  local line=""
  exec 8< <(timeout 60 podman logs -f "$1" 2>&1)
  local reader=$!
  line=$(grep -m1 -- "$2" <&8 || true)
  exec 8<&-
  kill "$reader" 2>/dev/null || true
  if [ -z "$line" ]; then
    echo "FAIL: $1 printed no '$2' within 60 s; its output:"
    podman logs "$1" 2>&1 | tail -n 20
    exit 1
  fi
  echo "$1: $line"
}

# --health-interval disable: no systemd timer (none here); the checks are
# run below with `podman healthcheck run`.
daemon() { podman run -d --label "$label" --network "$net" \
  --health-interval disable -v "$work/data:/data:ro" "$@" >/dev/null; }
daemon --name "disp-$$" "$img" dispatcher --work-dir /var/lib/ferry \
  --port 5050 --data-root /data
wait_log "disp-$$" "ferry-dispatcher listening on"
wait_log "disp-$$" "metrics on http://"
daemon --name "worker-$$" "$img" worker --dispatcher "disp-$$:5050" \
  --port 5051 --advertise "worker-$$:5051" --data-root /data --threads 2
wait_log "worker-$$" "ferry-worker listening on"
wait_log "worker-$$" "metrics on http://"

for c in "disp-$$" "worker-$$"; do
  if out=$(podman healthcheck run "$c" 2>&1); then
    echo "ok: HEALTHCHECK of $c: ${out:-healthy}"
  else
    echo "FAIL: HEALTHCHECK of $c: $out"
    fail=1
  fi
done

spec='tfrecord("/data/train-*.tfrecord") | decode(raw, 32, 32, 3) | batch(64)'
if ! out=$(timeout 120 podman run --rm --no-healthcheck --label "$label" --network "$net" \
    "$trainer_img" --dispatcher "disp-$$:5050" --spec "$spec" --epochs 1 \
    --timeout-ms 30000 2>&1); then
  echo "$out"
  echo "FAIL: the trainer container failed"
  fail=1
fi
while IFS= read -r l; do echo "trainer: $l"; done <<<"$out"
check "records through the trainer" \
  "$(echo "$out" | sed -n 's/^end of epoch: \([0-9]*\) records.*/\1/p' | head -n1)" "$records"

# The Python package in the trainer-gpu recipe image: a second epoch of a
# new job through ferry.Client.
if [ "${FERRY_CONTAINER_GPU_RECIPE:-0}" = 1 ]; then
  check "trainer-gpu image's default command" "$(run "$gpu_img")" "ferry $version"
  py='import ferry, sys
n = 0
with ferry.Client(sys.argv[1], sys.argv[2], epochs=1, timeout=60) as c:
    for epoch in c.epochs():
        for b in epoch:
            n += len(b)
            b.release()
print(n)'
  check "records through ferry.Client (python3, trainer-gpu recipe)" \
    "$(timeout 120 podman run --rm --no-healthcheck --label "$label" \
        --network "$net" "$gpu_img" python3 -c "$py" "disp-$$:5050" "$spec" 2>&1 | tail -n 3)" \
    "$records"
fi

status=$(run --network "$net" "$img" ctl status --dispatcher "disp-$$:5050" --json)
check "ferryctl status lists the worker by its advertised address" \
  "$(echo "$status" | grep -c "\"worker-$$:5051\"" || true)" 1

# SIGTERM: both daemons exit 0 (dispatcher last: the worker says goodbye).
for c in "worker-$$" "disp-$$"; do
  podman stop -t 30 "$c" >/dev/null
  check "$c exit status after SIGTERM" \
    "$(podman inspect "$c" --format '{{.State.ExitCode}}')" 0
done

cleanup
trap - EXIT
check "containers left behind" "$(podman ps -aq --filter "label=$label")" ""
check "network left behind" "$(if podman network exists "$net"; then echo "$net"; fi)" ""
check "untagged build images left behind" "$build_images_left" ""
[ "$fail" -eq 0 ] && echo "container: all checks passed"
exit "$fail"
