#!/usr/bin/env bash
# deploy/systemd under a real systemd: a Debian 12 container booted with
# systemd as PID 1 (podman --systemd=always), the two units and env files
# installed as docs/OPERATIONS.md says, the binaries in /usr/local/bin.
# Checks, with every hardening line of the units in force:
#  - both units start (Type=notify: active only after READY=1) and show the
#    daemons' STATUS= lines; the worker registered;
#  - the processes run with no capabilities, NoNewPrivs and a seccomp
#    filter, as a dynamic user who owns the journal (mode 0600) in
#    /var/lib/private/ferry;
#  - an epoch of shuffled GZIP shards through the trainer example: the
#    worker spills into its CacheDirectory and reads the data roots;
#  - systemctl reload reaches the daemons (SIGHUP logged);
#  - a stopped event loop (SIGSTOP) trips WatchdogSec (drop-in: 2 s): the
#    worker is killed (Result=watchdog) and restarted;
#  - systemctl stop: STOPPING, exit 0, Result=success, well inside
#    TimeoutStopSec.
# Skips (77), saying why, without podman, runc, privileges for a nested
# systemd, or the Debian 12 base image (FERRY_DEBIAN_IMAGE, default
# localhost/ferry-debian:bookworm, made by debootstrap for the container
# tests). The image it builds adds Debian's systemd and runtime libraries.
#
#   systemd_podman.sh SOURCE_DIR DISPATCHER_BIN WORKER_BIN FERRYCTL_BIN TRAINER_BIN
set -euo pipefail

src=${1:?source dir}
bins=("$(realpath "${2:?}")" "$(realpath "${3:?}")" "$(realpath "${4:?}")"
      "$(realpath "${5:?}")")
base=${FERRY_DEBIAN_IMAGE:-localhost/ferry-debian:bookworm}
image=localhost/ferry-systemd-test:latest
name=ferry-systemd-test-$$
units=$src/deploy/systemd
skip() { echo "SKIP: $*"; exit 77; }
fail() { echo "FAIL $*"; exit 1; }
ok() { echo "ok   $*"; }

command -v podman >/dev/null || skip "podman not installed (deploy/install-deps.sh installs it)"
command -v runc >/dev/null || skip "runc not installed (podman's crun cannot run in this cgroup setup)"
tmp=$(mktemp -d)
cleanup() {
  podman rm -f -t 0 "$name" >/dev/null 2>&1 || true
  rm -rf "$tmp"
}
trap cleanup EXIT
# crun refuses hybrid cgroup hierarchies ("cgroups in hybrid mode not
# supported"); runc runs them.
# Podman's default rlimits may exceed this machine's hard limits (no
# CAP_SYS_RESOURCE in a container): ask for the ones we have.
printf '[containers]\ndefault_ulimits = ["nofile=%s:%s", "nproc=%s:%s"]\n[engine]\nruntime = "runc"\n' \
  "$(ulimit -Hn)" "$(ulimit -Hn)" 4096 4096 > "$tmp/containers.conf"
export CONTAINERS_CONF=$tmp/containers.conf
podman image exists "$base" ||
  skip "no base image $base (the Debian 12 image the container tests make with debootstrap; set FERRY_DEBIAN_IMAGE)"

# The image: systemd, the programs' runtime libraries, the binaries; the
# trainer's libraries from outside the system directories come along.
ctx=$tmp/ctx
mkdir -p "$ctx/lib"
cp "${bins[@]}" "$ctx/"
# (awk, not grep -v: a build without CUDA has none, and grep's exit 1 would
# end the script under pipefail)
ldd "${bins[3]}" | awk '/=> \// && $3 !~ /^\/(usr\/)?lib\// {print $3}' |
  xargs -r cp -L -t "$ctx/lib"
cat > "$ctx/Containerfile" <<EOF
FROM $base
RUN apt-get update \\
 && DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends \\
      systemd systemd-sysv dbus libgrpc29 libprotobuf-c1 libuv1 \\
      libturbojpeg0 libjpeg62-turbo libucx0 zlib1g libsystemd0 libmicrohttpd12 \\
 && rm -rf /var/lib/apt/lists/*
COPY ferry-dispatcher ferry-worker ferryctl /usr/local/bin/
COPY ferry-example-trainer /usr/local/bin/
COPY lib/ /usr/local/lib/
RUN ldconfig
STOPSIGNAL SIGRTMIN+3
CMD ["/lib/systemd/systemd"]
EOF
old=$(podman image inspect --format '{{.Id}}' "$image" 2>/dev/null || true)
if ! out=$(timeout 400 podman build -q -t "$image" "$ctx" 2>&1); then
  echo "$out" | tail -20
  fail "podman build of the systemd image failed"
fi
# The previous build of this image (now untagged) goes; the apt layer,
# shared, stays as the cache of the next build.
new=$(podman image inspect --format '{{.Id}}' "$image")
[ -z "$old" ] || [ "$old" = "$new" ] || podman rmi "$old" >/dev/null 2>&1 || true

# --privileged: systemd sets up the units' namespaces (ProtectSystem=,
# PrivateTmp=, ...), which needs CAP_SYS_ADMIN in the container.
# --network none: the env files' fixed ports, on the container's loopback.
if ! out=$(timeout 60 podman run -d --name "$name" --privileged \
             --systemd=always --network none "$image" 2>&1); then
  echo "$out"
  skip "cannot boot systemd in a container here: $(tail -1 <<<"$out")"
fi
E() { timeout 60 podman exec "$name" "$@"; }
state=
for _ in $(seq 100); do
  state=$(E systemctl is-system-running 2>/dev/null || true)
  case $state in running|degraded) break ;; esac
  sleep 0.2 # polling systemd's state, bounded (20 s)
done
case $state in running|degraded) ;; *) fail "systemd in the container: '$state' after 20 s" ;; esac

# Installed as docs/OPERATIONS.md says; only the addresses differ from the
# examples (loopback, the dispatcher's address for the worker).
for u in ferry-dispatcher ferry-worker; do
  podman cp "$units/$u.service" "$name:/etc/systemd/system/$u.service"
done
E mkdir -p /etc/ferry /srv/ferry/data
sed 's/--host 0.0.0.0/--host 127.0.0.1/' "$units/dispatcher.env" > "$tmp/d.env"
sed 's/ferry-dispatcher.example.internal:5050/127.0.0.1:5050/; s/--host 0.0.0.0/--host 127.0.0.1/' \
  "$units/worker.env" > "$tmp/w.env"
podman cp "$tmp/d.env" "$name:/etc/ferry/dispatcher.env"
podman cp "$tmp/w.env" "$name:/etc/ferry/worker.env"
E systemctl daemon-reload
# systemctl start returns once READY=1 came (Type=notify) or failed.
if ! E systemctl start ferry-dispatcher ferry-worker; then
  E journalctl -u ferry-dispatcher -u ferry-worker --no-pager | tail -30
  fail "systemctl start ferry-dispatcher ferry-worker"
fi
show() { E systemctl show -p "$2" --value "$1"; }
for u in ferry-dispatcher ferry-worker; do
  [ "$(show $u ActiveState)/$(show $u SubState)" = active/running ] ||
    fail "$u: $(show $u ActiveState)/$(show $u SubState)"
done
st=$(show ferry-dispatcher StatusText)
[ "$st" = "serving on 127.0.0.1:5050, journal /var/lib/ferry" ] || fail "dispatcher STATUS '$st'"
ok "ferry-dispatcher.service active; STATUS '$st'"
st=
for _ in $(seq 50); do
  st=$(show ferry-worker StatusText)
  [[ $st == *"registered with 127.0.0.1:5050 as worker"* ]] && break
  sleep 0.2 # the first heartbeat's answer, bounded (10 s)
done
[[ $st == *"registered with 127.0.0.1:5050 as worker"* ]] || fail "worker STATUS '$st'"
ok "ferry-worker.service active; STATUS '$st'"

for u in ferry-dispatcher ferry-worker; do
  pid=$(show $u MainPID)
  s=$(E cat /proc/"$pid"/status)
  uid=$(awk '/^Uid:/{print $2}' <<<"$s")
  grep -qP '^CapEff:\t0+$' <<<"$s" && grep -qP '^CapBnd:\t0+$' <<<"$s" &&
    grep -qP '^NoNewPrivs:\t1$' <<<"$s" && grep -qP '^Seccomp:\t2$' <<<"$s" &&
    [ "$uid" -ge 61184 ] && [ "$uid" -le 65519 ] ||
    fail "$u (pid $pid): not confined: $(grep -E '^(Uid|Cap|NoNew|Seccomp)' <<<"$s" | tr '\t\n' '  ')"
  ok "$u runs as dynamic uid $uid, no capabilities, NoNewPrivs, seccomp filter"
  echo "     (open files: $(E grep 'Max open files' /proc/"$pid"/limits | tr -s ' '); LimitNOFILE=65536, capped by the container's hard limit)"
done
duid=$(awk '/^Uid:/{print $2}' <<<"$(E cat /proc/"$(show ferry-dispatcher MainPID)"/status)")
j=$(E stat -c '%u %a' /var/lib/private/ferry/journal)
[ "$j" = "$duid 600" ] || fail "journal: owner and mode '$j', expected '$duid 600'"
[ "$(E readlink /var/lib/ferry)" = private/ferry ] || fail "/var/lib/ferry is not the DynamicUser link"
ok "journal /var/lib/ferry/journal (/var/lib/private/ferry) owned by the dispatcher's uid, mode 600"

# An epoch through the confined worker: shuffled GZIP shards spill.
E ferryctl gen --out /srv/ferry/data/d --shards 2 --records 2000 --format jpeg \
  --size 32x32 --compression gzip >/dev/null
out=$(E ferry-example-trainer --dispatcher=127.0.0.1:5050 --epochs=1 \
  --spec='tfrecord("/srv/ferry/data/d/*.tfrecord.gz", compression=gzip) | decode(jpeg, 32, 32, 3) | shuffle(seed=1) | batch(100)' 2>&1) ||
  fail "trainer epoch: $out"
grep -q "records 2000," <<<"$out" || fail "trainer: expected 2000 records: $out"
ok "an epoch of shuffled GZIP shards through the units: $(grep -o 'records 2000,[^,]*' <<<"$out")"

# The metrics servers (the env files' --metrics-port 9090 and 9091) answer
# from inside the sandbox; bash's /dev/tcp, the image has no curl.
http_get() {
  E bash -c 'exec 3<>/dev/tcp/127.0.0.1/'"$1"' && printf "GET %s HTTP/1.0\r\n\r\n" '"$2"' >&3 && timeout 10 cat <&3'
}
for pm in "ferry-dispatcher 9090 ferry_dispatcher_journal_appends_total" \
          "ferry-worker 9091 ferry_worker_records_total"; do
  read -r u port metric <<<"$pm"
  out=$(http_get "$port" /metrics) || fail "$u: GET 127.0.0.1:$port/metrics failed"
  head -1 <<<"$out" | grep -q ' 200 ' && grep -q "^$metric" <<<"$out" ||
    fail "$u: /metrics on $port: no 200 with $metric: $(head -3 <<<"$out")"
  out=$(http_get "$port" /readyz) || fail "$u: GET /readyz failed"
  head -1 <<<"$out" | grep -q ' 200 ' || fail "$u: /readyz: $(head -1 <<<"$out")"
  ok "$u: /metrics on :$port has $metric, /readyz 200"
done

E systemctl reload ferry-dispatcher ferry-worker || fail "systemctl reload"
for _ in $(seq 50); do
  n=$(E journalctl -u ferry-dispatcher -u ferry-worker --no-pager | grep -c 'SIGHUP: re-reading' || true)
  [ "$n" -ge 2 ] && break
  sleep 0.2 # the log line reaching the journal, bounded (10 s)
done
[ "$n" -ge 2 ] || fail "systemctl reload: no 'SIGHUP: re-reading' from both daemons"
ok "systemctl reload: both daemons re-read their files (SIGHUP)"

# Watchdog: a loop that stops turning is killed and restarted.
E mkdir -p /etc/systemd/system/ferry-worker.service.d
printf '[Service]\nWatchdogSec=2s\n' > "$tmp/wd.conf"
podman cp "$tmp/wd.conf" "$name:/etc/systemd/system/ferry-worker.service.d/watchdog.conf"
E systemctl daemon-reload
E systemctl restart ferry-worker
pid=$(show ferry-worker MainPID)
E kill -STOP "$pid" 2>/dev/null || E sh -c "kill -STOP $pid"
new=$pid
for _ in $(seq 100); do
  new=$(show ferry-worker MainPID)
  [ "$new" != "$pid" ] && [ "$new" != 0 ] && [ "$(show ferry-worker ActiveState)" = active ] && break
  sleep 0.2 # 2 s watchdog + 2 s RestartSec, bounded (20 s)
done
# Not `journalctl | grep -q`: grep's early exit fails the pipe (pipefail).
log=$(E journalctl -u ferry-worker --no-pager)
grep -q 'Watchdog timeout (limit 2s)' <<<"$log" || {
  tail -25 <<<"$log"
  fail "no watchdog timeout after SIGSTOP of the worker (pid $pid)"; }
[ "$new" != "$pid" ] && [ "$(show ferry-worker NRestarts)" -ge 1 ] ||
  fail "the worker was not restarted after its watchdog timeout"
ok "SIGSTOPped worker: 'Watchdog timeout (limit 2s)', restarted (pid $pid -> $new)"

for u in ferry-worker ferry-dispatcher; do
  t0=$(date +%s%N)
  E systemctl stop $u
  ms=$(( ($(date +%s%N) - t0) / 1000000 ))
  r="$(show $u Result) $(show $u ExecMainStatus) $(show $u ActiveState)"
  [ "$r" = "success 0 inactive" ] || fail "$u stop: Result, status, state '$r'"
  [ "$ms" -lt 10000 ] || fail "$u stop took $ms ms"
  ok "systemctl stop $u: exit 0, Result=success, in $ms ms (TimeoutStopSec=30s)"
done
