#!/bin/sh
# The RPC-level fuzz test: starts a bare ferry-dispatcher and one
# ferry-worker on 127.0.0.1 (port 0, temporary dirs), runs grpcio_fuzz.py
# against both with the system python3, then stops both with SIGTERM,
# whatever happened, and fails if either had died.
#
# Usage: grpcio_fuzz.sh --dispatcher PATH --worker PATH --proto-dir DIR
# Exits 0 when every check passed, 1 otherwise, 77 (skip) when grpcio,
# protobuf or protoc is missing or FERRY_SKIP_INTEROP=1. FERRY_FUZZ_SEED
# replays a run; FERRY_RPC_FUZZ_CALLS sets the calls per method and kind.
set -u

here=$(cd "$(dirname "$0")" && pwd)
. "$here/daemons.sh"
require_grpcio grpcio_fuzz
dispatcher='' worker='' proto_dir=''
while [ $# -gt 0 ]; do
  case $1 in
    --dispatcher) dispatcher=$2; shift 2 ;;
    --worker) worker=$2; shift 2 ;;
    --proto-dir) proto_dir=$2; shift 2 ;;
    *) echo "grpcio_fuzz.sh: unknown argument '$1'" >&2; exit 2 ;;
  esac
done

work=$(mktemp -d /tmp/ferry-fuzz-XXXXXX)
dpid='' wpid=''
cleanup() {
  stop_daemon "$wpid"
  stop_daemon "$dpid"
  rm -rf "$work"
}
trap cleanup EXIT
trap 'exit 1' INT TERM

mkdir -p "$work/wd"
mkfifo "$work/dout" "$work/wout"
"$dispatcher" --port 0 --host 127.0.0.1 --work-dir "$work/wd" \
  --log-level warn >"$work/dout" 2>"$work/dispatcher.log" &
dpid=$!
exec 3<"$work/dout"
daddr=$(listening_addr 3)
if [ -z "$daddr" ]; then
  echo "grpcio_fuzz: FAIL: no listening line from the dispatcher"
  cat "$work/dispatcher.log"; echo "grpcio_fuzz: 0 passed, 1 failed"; exit 1
fi
"$worker" --dispatcher "$daddr" --port 0 --host 127.0.0.1 --threads 1 \
  --log-level warn >"$work/wout" 2>"$work/worker.log" &
wpid=$!
exec 4<"$work/wout"
waddr=$(listening_addr 4)
if [ -z "$waddr" ]; then
  echo "grpcio_fuzz: FAIL: no listening line from the worker"
  cat "$work/worker.log"; echo "grpcio_fuzz: 0 passed, 1 failed"; exit 1
fi

$python "$here/grpcio_fuzz.py" --dispatcher "$daddr" --dispatcher-pid "$dpid" \
  --worker "$waddr" --worker-pid "$wpid" --proto-dir "$proto_dir" \
  --work "$work" --calls "${FERRY_RPC_FUZZ_CALLS:-300}" \
  ${FERRY_FUZZ_SEED:+--seed "$FERRY_FUZZ_SEED"}
rc=$?
for p in "$dpid" "$wpid"; do
  if ! kill -0 "$p" 2>/dev/null; then
    echo "grpcio_fuzz: FAIL: daemon $p died during the fuzz"
    rc=1
  fi
done
if [ $rc -ne 0 ] && [ $rc -ne 77 ]; then
  echo "---- dispatcher log (tail) ----"; tail -n 30 "$work/dispatcher.log"
  echo "---- worker log (tail) ----"; tail -n 30 "$work/worker.log"
fi
exit $rc
