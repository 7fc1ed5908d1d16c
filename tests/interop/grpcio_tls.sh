#!/bin/sh
# Interop with Python grpcio over TLS (issue 8): makes a CA, certificates
# and tokens with tests/integration/make_certs.sh, starts ferry-dispatcher
# with TLS, mutual TLS and a status token on 127.0.0.1, and runs
# grpcio_tls.py: GetStatus with the CA, a client certificate and the token
# succeeds; without the token, with a wrong one, over plaintext or
# trusting another CA it fails; health needs no token. Stops the
# dispatcher with SIGTERM, whatever happened.
#
# Usage: grpcio_tls.sh --dispatcher PATH --proto-dir DIR
# Exits 0 when every check passed, 1 otherwise, 77 (skip) when grpcio,
# protobuf, protoc or openssl is missing or FERRY_SKIP_INTEROP=1.
set -u

if [ "${FERRY_SKIP_INTEROP:-0}" = 1 ]; then
  echo "grpcio_tls: skipped: FERRY_SKIP_INTEROP=1"
  exit 77
fi
here=$(cd "$(dirname "$0")" && pwd)
dispatcher=''
proto_dir=''
while [ $# -gt 0 ]; do
  case $1 in
    --dispatcher) dispatcher=$2; shift 2 ;;
    --proto-dir) proto_dir=$2; shift 2 ;;
    *) echo "grpcio_tls.sh: unknown argument '$1'" >&2; exit 2 ;;
  esac
done
if [ -z "$dispatcher" ] || [ -z "$proto_dir" ]; then
  echo "usage: grpcio_tls.sh --dispatcher PATH --proto-dir DIR" >&2
  exit 2
fi
python=/usr/bin/python3
if ! $python -c 'import grpc, google.protobuf' 2>/dev/null; then
  echo "grpcio_tls: skipped: $python lacks grpc or google.protobuf" \
       "(apt-get install python3-grpcio python3-protobuf)"
  exit 77
fi
if ! command -v openssl >/dev/null 2>&1; then
  echo "grpcio_tls: skipped: no openssl to make certificates"
  exit 77
fi

work=$(mktemp -d /tmp/ferry-grpcio-tls-XXXXXX)
pid=''
cleanup() {
  if [ -n "$pid" ] && kill -0 "$pid" 2>/dev/null; then
    kill -TERM "$pid" 2>/dev/null
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

certs=$work/certs
if ! bash "$here/../integration/make_certs.sh" "$certs" >/dev/null; then
  echo "grpcio_tls: FAIL: make_certs.sh failed"
  exit 1
fi
mkdir -p "$work/wd"
mkfifo "$work/out"
"$dispatcher" --port 0 --host 127.0.0.1 --work-dir "$work/wd" \
  --tls-cert "$certs/server.pem" --tls-key "$certs/server.key" \
  --tls-ca "$certs/ca.pem" --tls-client-auth \
  --client-token-file "$certs/client.token" \
  --worker-token-file "$certs/worker.token" \
  --status-token-file "$certs/status.token" \
  >"$work/out" 2>"$work/dispatcher.log" &
pid=$!
exec 3<"$work/out"
line=''
if ! line=$(timeout 10 head -n 1 <&3); then line=''; fi
addr=${line##*listening on }
if [ -z "$line" ] || [ "$addr" = "$line" ]; then
  echo "grpcio_tls: FAIL: the dispatcher printed no listening line in 10 s"
  cat "$work/dispatcher.log"
  exit 1
fi

$python "$here/grpcio_tls.py" --target "$addr" --proto-dir "$proto_dir" \
  --certs "$certs" --work "$work"
rc=$?
if [ $rc -ne 0 ] && [ $rc -ne 77 ]; then
  echo "---- dispatcher log ----"
  cat "$work/dispatcher.log"
fi
exit $rc
