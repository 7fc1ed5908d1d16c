#!/bin/bash
# The image's HEALTHCHECK: GET /healthz on 127.0.0.1:$FERRY_METRICS_PORT,
# the metrics server both daemons run (entrypoint.sh passes the port).
# Plain bash (/dev/tcp), so the image needs no HTTP client. Healthy when
# the answer's status line is 200; otherwise prints why and exits 1.
set -u
port=${FERRY_METRICS_PORT:-9090}
# (The braces keep bash's own "connect: Connection refused" out.)
if ! { exec 3<>"/dev/tcp/127.0.0.1/$port"; } 2>/dev/null; then
  echo "ferry-healthcheck: nothing accepts on 127.0.0.1:$port" \
    "(FERRY_METRICS_PORT; the daemon needs --metrics-port $port)"
  exit 1
fi
printf 'GET /healthz HTTP/1.0\r\nHost: 127.0.0.1\r\n\r\n' >&3
if ! IFS= read -r -t 5 status <&3; then
  echo "ferry-healthcheck: no answer from 127.0.0.1:$port/healthz in 5 s"
  exit 1
fi
status=${status%$'\r'}
case $status in
  "HTTP/1."?" 200"*) exit 0 ;;
esac
echo "ferry-healthcheck: 127.0.0.1:$port/healthz answered '$status'"
exit 1
