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

if [ "${FERRY_SKIP_INTEROP:-0}" = 1 ]; then
  echo "grpcio: skipped: FERRY_SKIP_INTEROP=1"
  exit 77
fi

here=$(cd "$(dirname "$0")" && pwd)
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
python=/usr/bin/python3
if ! $python -c 'import grpc, google.protobuf' 2>/dev/null; then
  echo "grpcio: skipped: $python lacks grpc or google.protobuf" \
       "(apt-get install python3-grpcio python3-protobuf)"
  exit 77
fi

work=$(mktemp -d /tmp/ferry-grpcio-XXXXXX)
pid=''
cleanup() {
  if [ -n "$pid" ] && kill -0 "$pid" 2>/dev/null; then
    kill -TERM "$pid" 2>/dev/null
    # Bounded: up to 5 s for a clean exit, then SIGKILL.
    i=0
    while kill -0 "$pid" 2>/dev/null && [ $i -lt 50 ]; do
      sleep 0.1
      i=$((i + 1))
    done
    kill -KILL "$pid" 2>/dev/null
    wait "$pid" 2>/dev/null
  fi
  rm -rf "$work"
}
trap cleanup EXIT
trap 'exit 1' INT TERM

mkdir -p "$work/wd"
mkfifo "$work/out"
"$dispatcher" --port 0 --host 127.0.0.1 --work-dir "$work/wd" \
  >"$work/out" 2>"$work/dispatcher.log" &
pid=$!
# Keep the FIFO open on our side for the dispatcher's whole life (so its
# later writes never hit a closed pipe) and read the listening line from
# it, bounded by 10 s.
exec 3<"$work/out"
line=''
if ! line=$(timeout 10 head -n 1 <&3); then line=''; fi
addr=${line##*listening on }
if [ -z "$line" ] || [ "$addr" = "$line" ]; then
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
