#!/bin/sh
# ferry-example-trainer --help: a usage line first, then every flag with
# a description; a stray argument is a usage error (exit 2) that shows
# the usage on stderr. Usage: check_help.sh PATH-TO-ferry-example-trainer
set -eu
bin=$1
out=$("$bin" --help)
first=$(printf '%s\n' "$out" | head -n 1)
case $first in
  "usage: ferry-example-trainer "*) ;;
  *) echo "no usage line first: '$first'" >&2; exit 1 ;;
esac
# A flag line is "  --name[ TYPE]" padded to column 29, then its help.
bare=$(printf '%s\n' "$out" | grep -E '^  --' |
       awk 'length($0) <= 29 || substr($0, 30) ~ /^ *$/' || true)
if [ -n "$bare" ]; then
  echo "flags without a description:" >&2
  printf '%s\n' "$bare" >&2
  exit 1
fi
flags=$(printf '%s\n' "$out" | grep -c -E '^  --')
[ "$flags" -ge 15 ] || { echo "only $flags flags listed" >&2; exit 1; }
set +e
"$bin" stray >/dev/null 2>"${TMPDIR:-/tmp}/ferry-help-$$.err"
rc=$?
set -e
err=$(cat "${TMPDIR:-/tmp}/ferry-help-$$.err")
rm -f "${TMPDIR:-/tmp}/ferry-help-$$.err"
[ "$rc" -eq 2 ] || { echo "stray argument: exit $rc, not 2" >&2; exit 1; }
case $err in
  *"unexpected argument 'stray'"*"usage: ferry-example-trainer"*) ;;
  *) echo "stray argument: no usage on stderr: $err" >&2; exit 1 ;;
esac
set +e
err=$("$bin" --dispatcher 127.0.0.1:1 2>&1 >/dev/null)
rc=$?
set -e
[ "$rc" -eq 2 ] || { echo "no spec: exit $rc, not 2" >&2; exit 1; }
case $err in
  *"--spec SPEC or --dataset-id ID"*) ;;
  *) echo "no spec: the message names no flag: $err" >&2; exit 1 ;;
esac
echo "ok: usage line and $flags described flags"
