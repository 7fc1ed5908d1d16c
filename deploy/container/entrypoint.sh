#!/bin/sh
# The image's ENTRYPOINT: the first argument names the role.
#
#   dispatcher ARGS...   exec ferry-dispatcher ARGS
#   worker ARGS...       exec ferry-worker ARGS
#   ctl ARGS...          exec ferryctl ARGS
#   anything else        exec'd as given (ferry-worker --version, bash, ...)
#
# For the two daemons it adds `--metrics-port $FERRY_METRICS_PORT` (the
# image sets 9090) unless ARGS name --metrics-port already or the variable
# is empty: the HEALTHCHECK (ferry-healthcheck) reads /healthz there.
set -eu

role=${1:-}
case $role in
  dispatcher | worker)
    shift
    prog=ferry-$role
    port=${FERRY_METRICS_PORT:-}
    for a in "$@"; do
      case $a in --metrics-port | --metrics-port=*) port= ;; esac
    done
    if [ -n "$port" ]; then
      exec "$prog" "$@" --metrics-port "$port"
    fi
    exec "$prog" "$@"
    ;;
  ctl)
    shift
    exec ferryctl "$@"
    ;;
  "")
    echo "usage: ROLE [ARGS...]: ROLE is dispatcher, worker or ctl" \
      "(or a program to run, e.g. ferry-worker --version)" >&2
    exit 2
    ;;
  *)
    exec "$@"
    ;;
esac
