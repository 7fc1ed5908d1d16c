#!/usr/bin/env bash
# Checks deploy/k8s with the real tools:
#   - yamllint (deploy/.yamllint) over every YAML file in deploy/;
#   - `kubectl kustomize` renders the base and every overlay;
#   - kubernetes-validate (PyPI, pinned in venv.sh) accepts every rendered
#     object, --strict (no unknown field), for Kubernetes $K8S_VERSION;
#   - check_images.py: every container's and init container's image is
#     the project's (REGISTRY/ferry:VERSION, the trainer's ferry-trainer),
#     never a bare name pulled from docker.io;
#   - check_commands.py runs every container's command line, preStop
#     hook and --config file against the programs of this build (every
#     flag exists and parses), and checks paths, probes and ports.
# The programs: FERRY_DISPATCHER_BIN, FERRY_WORKER_BIN, FERRYCTL_BIN,
# FERRY_TRAINER_BIN (tests/deploy/CMakeLists.txt sets them).
# Skips (77) when kubectl or yamllint is missing or the venv cannot be made.
set -euo pipefail
root=$(cd "$(dirname "$0")/../.." && pwd)
K8S_VERSION=1.37.0
version=$(sed -n 's/^project(ferry VERSION \([0-9.]*\).*/\1/p' "$root/CMakeLists.txt")
# shellcheck source=tests/deploy/venv.sh
. "$root/tests/deploy/venv.sh"

for tool in kubectl yamllint python3; do
  command -v "$tool" >/dev/null ||
    { echo "SKIP: $tool is not installed (deploy/install-deps.sh)"; exit 77; }
done
deploy_venv  # its python has PyYAML (a kubernetes-validate dependency)

work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
fail=0

echo "== yamllint $(yamllint --version | awk '{print $2}')"
if yamllint --strict -c "$root/deploy/.yamllint" "$root/deploy"; then
  echo "ok: yamllint deploy/"
else
  echo "FAIL: yamllint deploy/"
  fail=1
fi

dirs=("$root/deploy/k8s/base")
for d in "$root"/deploy/k8s/overlays/*/; do dirs+=("${d%/}"); done
if [ ${#dirs[@]} -lt 4 ]; then
  echo "FAIL: expected the base and 3 overlays, found: ${dirs[*]#"$root"/}"
  fail=1
fi
for d in "${dirs[@]}"; do
  name=${d#"$root"/deploy/k8s/}
  out=$work/${name//\//-}.yaml
  echo "== $name"
  if ! kubectl kustomize "$d" >"$out" 2>"$work/err"; then
    cat "$work/err"
    echo "FAIL: kubectl kustomize $name"
    fail=1
    continue
  fi
  echo "ok: kubectl kustomize $name: $(grep -c '^kind:' "$out") objects"
  if "$DEPLOY_VENV/bin/kubernetes-validate" --strict --quiet \
      -k "$K8S_VERSION" "$out"; then
    echo "ok: kubernetes-validate --strict -k $K8S_VERSION $name"
  else
    echo "FAIL: kubernetes-validate $name"
    fail=1
  fi
  base=("$d/kustomization.yaml")
  [ "$name" != base ] || base=(--base)
  if ! "$DEPLOY_VENV/bin/python" "$root/tests/deploy/check_images.py" "$out" \
      "$version" "${base[@]}"; then
    fail=1
  fi
  if ! "$DEPLOY_VENV/bin/python" "$root/tests/deploy/check_commands.py" "$out"; then
    fail=1
  fi
done
[ "$fail" -eq 0 ] && echo "k8s: all checks passed"
exit "$fail"
