# Shared by the grpcio interop wrappers (grpcio.sh, grpcio_tls.sh,
# grpcio_fuzz.sh), sourced with `. "$here/daemons.sh"`: the checks that
# skip a test, a bounded stop, and the daemons' listening line.

python=/usr/bin/python3

# Exits 77 (skip) with a line naming TAG when FERRY_SKIP_INTEROP=1 or the
# system python lacks grpc or google.protobuf.
require_grpcio() {
  if [ "${FERRY_SKIP_INTEROP:-0}" = 1 ]; then
    echo "$1: skipped: FERRY_SKIP_INTEROP=1"
    exit 77
  fi
  if ! $python -c 'import grpc, google.protobuf' 2>/dev/null; then
    echo "$1: skipped: $python lacks grpc or google.protobuf" \
         "(apt-get install python3-grpcio python3-protobuf)"
    exit 77
  fi
}

# SIGTERM to pid $1 (may be empty), up to 5 s for it to exit, then
# SIGKILL; reaps it.
stop_daemon() {
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

# Prints HOST:PORT from the "listening on HOST:PORT" line a daemon writes
# to the FIFO open on file descriptor $1, waiting at most 10 s; prints
# nothing when there is none. The caller keeps the FIFO open for the
# daemon's whole life, so its later writes never hit a closed pipe.
listening_addr() {
  line=''
  if ! line=$(timeout 10 head -n 1 <&"$1"); then line=''; fi
  addr=${line##*listening on }
  if [ -n "$line" ] && [ "$addr" != "$line" ]; then
    echo "$addr"
  fi
}
