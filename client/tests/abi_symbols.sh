#!/bin/sh
# libferry's dynamic symbols are exactly its FERRY_API functions: every
# symbol `nm -D --defined-only` lists must be a ferry_ name (no ferry__
# internals, no protobuf-c, gRPC or other code linked in), and the set
# must equal the functions declared FERRY_API in the public headers.
# Usage: abi_symbols.sh LIBFERRY.so PUBLIC_HEADER...
set -eu
lib=$1
shift
[ -f "$lib" ] || { echo "FAIL: no library at $lib"; exit 1; }
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT

nm -D --defined-only "$lib" | awk 'NF >= 3 { print $3 }' | sed 's/@.*//' |
  sort -u >"$tmp/exported"
# Declarations, comments stripped: FERRY_API <type> name(
perl -0777 -ne 's{/\*.*?\*/}{}gs; s{//[^\n]*}{}g;
  while (/\bFERRY_API\b[^;(){}]*?\b(ferry_\w+)\s*\(/gs) { print "$1\n" }' \
  "$@" | sort -u >"$tmp/declared"

status=0
n_exp=$(wc -l <"$tmp/exported")
n_dec=$(wc -l <"$tmp/declared")
if [ "$n_dec" -lt 10 ]; then
  echo "FAIL: only $n_dec FERRY_API declarations found in: $*"
  status=1
fi
if grep -v '^ferry_' "$tmp/exported" >"$tmp/foreign" ||
   grep '^ferry__' "$tmp/exported" >>"$tmp/foreign"; then
  echo "FAIL: $lib exports symbols that are not public ferry_ functions:"
  sed 's/^/  /' "$tmp/foreign"
  status=1
fi
comm -23 "$tmp/exported" "$tmp/declared" >"$tmp/extra"
comm -13 "$tmp/exported" "$tmp/declared" >"$tmp/missing"
if [ -s "$tmp/extra" ]; then
  echo "FAIL: exported but not declared FERRY_API in the public headers:"
  sed 's/^/  /' "$tmp/extra"
  status=1
fi
if [ -s "$tmp/missing" ]; then
  echo "FAIL: declared FERRY_API but not exported by $lib:"
  sed 's/^/  /' "$tmp/missing"
  status=1
fi
if [ $status -eq 0 ]; then
  echo "ok: $lib exports exactly the $n_exp FERRY_API functions of $# public headers"
fi
exit $status
