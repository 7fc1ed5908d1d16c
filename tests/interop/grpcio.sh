#!/bin/sh
# Interop with Python grpcio: starts a bare ferry-dispatcher on 127.0.0.1
# (port 0, a temporary work dir), runs grpcio_status.py against it with
# the system python3 (Debian's python3-grpcio and python3-protobuf), then
# stops the dispatcher with SIGTERM, whatever happened.
#
# Usage: grpcio.sh --dispatcher PATH --proto-dir DIR
# Exits 0 when every check passed, 1 otherwise, 77 (skip) when grpcio,
# protobuf or protoc is missing or FERRY_SKIP_INTEROP=1.
set -u

here=$(cd "$(dirname "$0")" && pwd)
. "$here/daemons.sh"
require_grpcio grpcio
dispatcher=''
proto_dir=''
while [ $# -gt 0 ]; do
  case $1 in
    --dispatcher) dispatcher=$2; shift 2 ;;
    --proto-dir) proto_dir=$2; shift 2 ;;
    *) echo "grpcio.sh: unknown argument '$1'" >&2; exit 2 ;;
  esac
done
if [ -z "$dispatcher" ] || [ -z "$proto_dir" ]; then
  echo "usage: grpcio.sh --dispatcher PATH --proto-dir DIR" >&2
  exit 2
fi
work=$(mktemp -d /tmp/ferry-grpcio-XXXXXX)
pid=''
cleanup() {
  stop_daemon "$pid"
  rm -rf "$work"
}
trap cleanup EXIT
trap 'exit 1' INT TERM

mkdir -p "$work/wd"
mkfifo "$work/out"
"$dispatcher" --port 0 --host 127.0.0.1 --work-dir "$work/wd" \
  >"$work/out" 2>"$work/dispatcher.log" &
pid=$!
exec 3<"$work/out"
addr=$(listening_addr 3)
if [ -z "$addr" ]; then
  echo "grpcio: FAIL: the dispatcher printed no listening line in 10 s"
  cat "$work/dispatcher.log"
  echo "grpcio: 0 passed, 1 failed"
  exit 1
fi

$python "$here/grpcio_status.py" --target "$addr" --proto-dir "$proto_dir" \
  --work "$work"
rc=$?
if [ $rc -ne 0 ] && [ $rc -ne 77 ]; then
  echo "---- dispatcher log ----"
  cat "$work/dispatcher.log"
fi
exit $rc
