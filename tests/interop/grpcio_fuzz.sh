#!/bin/sh
# The RPC-level fuzz test (issue 8): starts a bare ferry-dispatcher and one
# ferry-worker on 127.0.0.1 (port 0, temporary dirs), runs grpcio_fuzz.py
# against both with the system python3, then stops both with SIGTERM,
# whatever happened, and fails if either had died.
#
# Usage: grpcio_fuzz.sh --dispatcher PATH --worker PATH --proto-dir DIR
# Exits 0 when every check passed, 1 otherwise, 77 (skip) when grpcio,
# protobuf or protoc is missing or FERRY_SKIP_INTEROP=1. FERRY_FUZZ_SEED
# replays a run; FERRY_RPC_FUZZ_CALLS sets the calls per method and kind.
set -u

if [ "${FERRY_SKIP_INTEROP:-0}" = 1 ]; then
  echo "grpcio_fuzz: skipped: FERRY_SKIP_INTEROP=1"
  exit 77
fi
here=$(cd "$(dirname "$0")" && pwd)
dispatcher='' worker='' proto_dir=''
while [ $# -gt 0 ]; do
  case $1 in
    --dispatcher) dispatcher=$2; shift 2 ;;
    --worker) worker=$2; shift 2 ;;
    --proto-dir) proto_dir=$2; shift 2 ;;
    *) echo "grpcio_fuzz.sh: unknown argument '$1'" >&2; exit 2 ;;
  esac
done
python=/usr/bin/python3
if ! $python -c 'import grpc, google.protobuf' 2>/dev/null; then
  echo "grpcio_fuzz: skipped: $python lacks grpc or google.protobuf"
  exit 77
fi

work=$(mktemp -d /tmp/ferry-fuzz-XXXXXX)
dpid='' wpid=''
stop() {
  if [ -n "$1" ] && kill -0 "$1" 2>/dev/null; then
    kill -TERM "$1" 2>/dev/null
    i=0
    while kill -0 "$1" 2>/dev/null && [ $i -lt 50 ]; do
      sleep 0.1
      i=$((i + 1))
    done
    kill -KILL "$1" 2>/dev/null
    wait "$1" 2>/dev/null
  fi
}
cleanup() {
  stop "$wpid"
  stop "$dpid"
  rm -rf "$work"
}
trap cleanup EXIT
trap 'exit 1' INT TERM

# Reads the "listening on HOST:PORT" line from FIFO fd $1 within 10 s.
listening() {
  line=''
  if ! line=$(timeout 10 head -n 1 <&"$1"); then line=''; fi
  addr=${line##*listening on }
  [ -n "$line" ] && [ "$addr" != "$line" ] && echo "$addr"
}

mkdir -p "$work/wd"
mkfifo "$work/dout" "$work/wout"
"$dispatcher" --port 0 --host 127.0.0.1 --work-dir "$work/wd" \
  --log-level warn >"$work/dout" 2>"$work/dispatcher.log" &
dpid=$!
exec 3<"$work/dout"
daddr=$(listening 3)
if [ -z "$daddr" ]; then
  echo "grpcio_fuzz: FAIL: no listening line from the dispatcher"
  cat "$work/dispatcher.log"; echo "grpcio_fuzz: 0 passed, 1 failed"; exit 1
fi
"$worker" --dispatcher "$daddr" --port 0 --host 127.0.0.1 --threads 1 \
  --log-level warn >"$work/wout" 2>"$work/worker.log" &
wpid=$!
exec 4<"$work/wout"
waddr=$(listening 4)
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
