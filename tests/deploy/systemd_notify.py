#!/usr/bin/env python3
"""The daemons' systemd notifications, checked through a NOTIFY_SOCKET this
test owns (an AF_UNIX datagram socket, as systemd's own):

 * READY=1 (with MAINPID=the daemon's pid and a STATUS) arrives only once
   the gRPC port accepts: the "listening" line is already on stdout when
   READY arrives, and a TCP connect right then succeeds;
 * the worker's STATUS then names its registration with the dispatcher;
 * SIGTERM gives STOPPING=1, and the daemon exits 0;
 * WATCHDOG_USEC=200000 with WATCHDOG_PID=the daemon's pid gives WATCHDOG=1
   about every 100 ms; with WATCHDOG_PID naming another process, none;
 * --version prints "ferry-dispatcher VERSION" / "ferry-worker VERSION".

Every wait is bounded; every daemon started is stopped and reaped.

    systemd_notify.py DISPATCHER_BIN WORKER_BIN VERSION
"""
import os
import re
import select
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time

WAIT_S = 20.0  # bound of every wait for a message, a line or an exit

failures = []
procs = []


def check(ok, what):
    print(("ok   " if ok else "FAIL ") + what, flush=True)
    if not ok:
        failures.append(what)
    return ok


class Notify:
    """The socket a service manager would listen on."""

    def __init__(self, path):
        self.path = path
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        self.sock.bind(path)

    def recv(self, timeout):
        """One datagram as (arrival time, {key: value}), or None."""
        r, _, _ = select.select([self.sock], [], [], max(timeout, 0))
        if not r:
            return None
        data = self.sock.recv(65536).decode()
        fields = dict(l.split("=", 1) for l in data.split("\n") if "=" in l)
        return time.monotonic(), fields

    def until(self, key, timeout=WAIT_S):
        """Messages up to and including the first with `key`; (list, found)."""
        seen, deadline = [], time.monotonic() + timeout
        while True:
            m = self.recv(deadline - time.monotonic())
            if m is None:
                return seen, False
            seen.append(m)
            if key in m[1]:
                return seen, True

    def close(self):
        self.sock.close()


def start(argv, env_extra, wrap_pid=False):
    """Starts a daemon in its own process group. wrap_pid: WATCHDOG_PID is
    set to the daemon's own pid (a shell exports $$, then execs)."""
    env = dict(os.environ)
    for k in ("NOTIFY_SOCKET", "WATCHDOG_USEC", "WATCHDOG_PID"):
        env.pop(k, None)
    env.update(env_extra)
    if wrap_pid:
        argv = ["/bin/sh", "-c", 'WATCHDOG_PID=$$; export WATCHDOG_PID; '
                'exec "$@"', "sh"] + argv
    p = subprocess.Popen(argv, env=env, stdout=subprocess.PIPE,
                         stderr=subprocess.PIPE, start_new_session=True)
    procs.append(p)
    return p


def stdout_line_ready(p):
    """The next stdout line if it is already there (no waiting), else None."""
    r, _, _ = select.select([p.stdout], [], [], 0)
    return p.stdout.readline().decode() if r else None


def read_line(p, timeout=WAIT_S):
    r, _, _ = select.select([p.stdout], [], [], timeout)
    return p.stdout.readline().decode() if r else ""


def listening_port(line, name):
    m = re.match(r"%s listening on (\S+):(\d+)$" % name, line.strip())
    return int(m.group(2)) if m else None


def connects(port):
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=5):
            return True
    except OSError as e:
        print("     connect 127.0.0.1:%d: %s" % (port, e))
        return False


def wait_exit(p, timeout=WAIT_S):
    try:
        return p.wait(timeout)
    except subprocess.TimeoutExpired:
        return None


def check_ready(name, p, notify):
    """READY=1 first, then the port: returns the port or None."""
    msgs, found = notify.until("READY")
    if not check(found, "%s: READY=1 within %.0f s" % (name, WAIT_S)):
        return None
    t, f = msgs[-1]
    # Right when READY arrives: the listening line must already be out, and
    # the port must accept.
    line = stdout_line_ready(p)
    check(line is not None and listening_port(line, name) is not None,
          "%s: the 'listening on' line was printed before READY=1 (got %r)"
          % (name, line))
    port = listening_port(line or read_line(p), name)
    if port is None:
        return None
    check(connects(port), "%s: 127.0.0.1:%d accepts a TCP connection right "
          "when READY=1 arrives" % (name, port))
    check(f.get("MAINPID") == str(p.pid), "%s: READY carries MAINPID=%d "
          "(got %s)" % (name, p.pid, f.get("MAINPID")))
    check("serving on" in f.get("STATUS", ""), "%s: READY carries STATUS "
          "'serving on ...' (got %r)" % (name, f.get("STATUS")))
    return port


def check_stop(name, p, notify):
    p.send_signal(signal.SIGTERM)
    msgs, found = notify.until("STOPPING")
    check(found, "%s: STOPPING=1 after SIGTERM" % name)
    rc = wait_exit(p)
    check(rc == 0, "%s: exits 0 after SIGTERM (got %s)" % (name, rc))
    return msgs


def test_version(bins, version):
    # Also with a --config file that does not exist: the version answers
    # without reading it.
    for extra in ([], ["--config", "/nonexistent/ferry.conf"]):
        for name, b in bins.items():
            r = subprocess.run([b] + extra + ["--version"],
                               capture_output=True, timeout=30)
            check(r.returncode == 0 and r.stdout.decode() == "%s %s\n" %
                  (name, version), "%s %s--version prints '%s %s' and "
                  "exits 0 (got %d, %r)" % (name, " ".join(extra + [""]),
                                            name, version, r.returncode,
                                            r.stdout))


def test_dispatcher(b, tmp):
    name = "ferry-dispatcher"
    notify = Notify(os.path.join(tmp, "notify-d"))
    p = start([b, "--work-dir", os.path.join(tmp, "wd1"), "--host",
               "127.0.0.1", "--port", "0", "--log-level", "warn"],
              {"NOTIFY_SOCKET": notify.path})
    if check_ready(name, p, notify) is not None:
        check_stop(name, p, notify)
    notify.close()


def test_worker(bd, bw, tmp):
    name = "ferry-worker"
    d = start([bd, "--work-dir", os.path.join(tmp, "wd2"), "--host",
               "127.0.0.1", "--port", "0", "--log-level", "warn"], {})
    dport = listening_port(read_line(d), "ferry-dispatcher")
    if not check(dport is not None, "dispatcher for the worker test started"):
        return
    notify = Notify(os.path.join(tmp, "notify-w"))
    p = start([bw, "--dispatcher", "127.0.0.1:%d" % dport, "--host",
               "127.0.0.1", "--port", "0", "--log-level", "warn"],
              {"NOTIFY_SOCKET": notify.path})
    if check_ready(name, p, notify) is not None:
        msgs, found = notify.until("STATUS")
        st = msgs[-1][1].get("STATUS", "") if found else ""
        check(re.search(r"registered with 127\.0\.0\.1:%d as worker \d+" %
                        dport, st) is not None,
              "ferry-worker: STATUS then says it registered (got %r)" % st)
        check_stop(name, p, notify)
    notify.close()
    d.send_signal(signal.SIGTERM)
    check(wait_exit(d) == 0, "dispatcher of the worker test exits 0")


def test_watchdog(name, argv, tmp, tag):
    # WATCHDOG_PID = the daemon itself: pings about every 100 ms.
    notify = Notify(os.path.join(tmp, "notify-wd-" + tag))
    p = start(argv, {"NOTIFY_SOCKET": notify.path,
                     "WATCHDOG_USEC": "200000"}, wrap_pid=True)
    pings, deadline = [], time.monotonic() + WAIT_S
    while len(pings) < 8:
        m = notify.recv(deadline - time.monotonic())
        if m is None:
            break
        if m[1].get("WATCHDOG") == "1":
            pings.append(m[0])
    if check(len(pings) >= 8, "%s: 8 WATCHDOG=1 pings with WATCHDOG_USEC="
             "200000 within %.0f s (got %d)" % (name, WAIT_S, len(pings))):
        gaps = [b - a for a, b in zip(pings[1:], pings[2:])]  # skip the first
        med = statistics.median(gaps)
        check(0.05 <= med <= 0.3, "%s: median gap between pings %.0f ms "
              "(half of WatchdogSec: 100 ms; accepted 50..300)" %
              (name, med * 1000))
    check_stop(name, p, notify)
    notify.close()

    # WATCHDOG_PID = another process (this test): the daemon must not ping.
    notify = Notify(os.path.join(tmp, "notify-wd-other-" + tag))
    p = start(argv, {"NOTIFY_SOCKET": notify.path, "WATCHDOG_USEC": "200000",
                     "WATCHDOG_PID": str(os.getpid())})
    msgs, found = notify.until("READY")
    if check(found, "%s: READY=1 with WATCHDOG_PID of another process" % name):
        # Pings would come every 100 ms: three periods without one.
        extra = []
        end = time.monotonic() + 0.3
        while True:
            m = notify.recv(end - time.monotonic())
            if m is None:
                break
            extra.append(m)
        msgs += extra + check_stop(name, p, notify)
        check(not any("WATCHDOG" in f for _, f in msgs),
              "%s: no WATCHDOG=1 when WATCHDOG_PID names another process" %
              name)
    else:
        check_stop(name, p, notify)
    notify.close()


def main():
    bd, bw, version = sys.argv[1:4]
    tmp = tempfile.mkdtemp(prefix="ferry-notify-")
    try:
        test_version({"ferry-dispatcher": bd, "ferry-worker": bw}, version)
        test_dispatcher(bd, tmp)
        test_worker(bd, bw, tmp)
        test_watchdog("ferry-dispatcher",
                      [bd, "--work-dir", os.path.join(tmp, "wd3"), "--host",
                       "127.0.0.1", "--port", "0", "--log-level", "warn"],
                      tmp, "d")
        test_watchdog("ferry-worker",
                      [bw, "--dispatcher", "127.0.0.1:9", "--host",
                       "127.0.0.1", "--port", "0", "--log-level", "error"],
                      tmp, "w")
    finally:
        for p in procs:
            if p.poll() is None:
                print("FAIL a daemon (pid %d) was still running: killed" %
                      p.pid)
                failures.append("leftover pid %d" % p.pid)
                os.killpg(p.pid, signal.SIGKILL)
                p.wait(WAIT_S)
            for f in (p.stdout, p.stderr):
                f.close()
        shutil.rmtree(tmp, ignore_errors=True)
    check(all(p.poll() is not None for p in procs),
          "no daemon left running (%d started)" % len(procs))
    if failures:
        print("%d check(s) failed" % len(failures))
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
