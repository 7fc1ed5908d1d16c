#!/bin/sh
# Interop with Python grpcio over TLS: makes a CA, certificates
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

here=$(cd "$(dirname "$0")" && pwd)
. "$here/daemons.sh"
require_grpcio grpcio_tls
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
if ! command -v openssl >/dev/null 2>&1; then
  echo "grpcio_tls: skipped: no openssl to make certificates"
  exit 77
fi

work=$(mktemp -d /tmp/ferry-grpcio-tls-XXXXXX)
pid=''
cleanup() {
  stop_daemon "$pid"
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
addr=$(listening_addr 3)
if [ -z "$addr" ]; then
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
