"""Helpers of the Python suite: a local cluster (dispatcher and workers of
this build tree on 127.0.0.1, port 0) and generated datasets read back
record by record, so tests can compare every batch with the files.

The daemons come from the environment (ctest passes them):
  FERRY_PY_DISPATCHER  ferry-dispatcher
  FERRY_PY_WORKER      ferry-worker
  FERRY_PY_FERRYCTL    ferryctl
or, when unset, from $FERRY_BUILD_DIR (default: <repo>/build).

Every wait here is bounded; nothing sleeps to synchronise. A daemon is
stopped with SIGTERM, then SIGKILL after a bound, and reaped.
"""
import json
import os
import queue
import random
import signal
import socket
import struct
import subprocess
import threading
import time

import pytest

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def _bin(env, rel):
    p = os.environ.get(env)
    if p:
        return p
    build = os.environ.get("FERRY_BUILD_DIR", os.path.join(REPO, "build"))
    return os.path.join(build, rel)


DISPATCHER = _bin("FERRY_PY_DISPATCHER", "dispatcher/ferry-dispatcher")
WORKER = _bin("FERRY_PY_WORKER", "worker/ferry-worker")
FERRYCTL = _bin("FERRY_PY_FERRYCTL", "client/ctl/ferryctl")

LISTEN_WAIT_S = 10.0   # a daemon prints its listening line within this
STOP_WAIT_S = 5.0      # SIGTERM, then SIGKILL after this
WORKERS_WAIT_S = 10.0  # workers register (one 100 ms heartbeat) within this


def check_binaries():
    missing = [p for p in (DISPATCHER, WORKER, FERRYCTL)
               if not os.access(p, os.X_OK)]
    return missing


def torch_or_skip():
    """Debian's python3-torch through the venv's system site packages; a
    skip with the reason when it cannot be imported."""
    try:
        import torch  # noqa: F401
    except Exception as e:  # ImportError, or a broken install
        pytest.skip("torch cannot be imported (%s: %s); install Debian's "
                    "python3-torch (deploy/install-deps.sh)"
                    % (type(e).__name__, e))
    return torch


# ---- daemons -----------------------------------------------------------

class Daemon:
    """One daemon process: stdout drained by a thread (its first
    'listening on' line gives the address), stderr in a log file."""

    def __init__(self, name, argv, log_dir):
        self.name = name
        self.argv = argv
        self.log = os.path.join(log_dir, name + ".log")
        self.addr = None
        self._lines = queue.Queue()
        with open(self.log, "wb") as err:
            # A process group of its own: a Ctrl-C sent to the test's
            # group (the KeyboardInterrupt tests signal only our thread,
            # but a user may press Ctrl-C) does not reach the daemons.
            self.proc = subprocess.Popen(
                argv, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                stderr=err, process_group=0, close_fds=True)
        self._drain = threading.Thread(target=self._read_stdout,
                                       name=name + "-stdout", daemon=True)
        self._drain.start()
        deadline = time.monotonic() + LISTEN_WAIT_S
        while self.addr is None:
            left = deadline - time.monotonic()
            try:
                line = self._lines.get(timeout=max(left, 0.0))
            except queue.Empty:
                line = None
            if line is None:
                self.stop()
                raise RuntimeError(
                    "%s printed no 'listening on' line within %.0f s "
                    "(exit status %s); log %s:\n%s"
                    % (name, LISTEN_WAIT_S, self.proc.returncode, self.log,
                       self.tail()))
            if "listening on " in line:
                self.addr = line.split("listening on ", 1)[1].strip()

    def _read_stdout(self):
        for raw in self.proc.stdout:
            self._lines.put(raw.decode("utf-8", "replace"))
        self._lines.put(None)  # end of output: the daemon exited

    def tail(self, n=30):
        try:
            with open(self.log, "r", errors="replace") as f:
                return "".join(f.readlines()[-n:])
        except OSError:
            return ""

    @property
    def pid(self):
        return self.proc.pid

    def alive(self):
        return self.proc.poll() is None

    def kill(self, sig=signal.SIGKILL):
        """Sends `sig` and, for SIGKILL, reaps the process (bounded)."""
        if self.alive():
            self.proc.send_signal(sig)
        if sig == signal.SIGKILL:
            self.proc.wait(timeout=STOP_WAIT_S)

    def stop(self):
        """SIGTERM, up to STOP_WAIT_S for the exit, then SIGKILL; reaps.
        Returns the exit status and how many seconds it took."""
        t0 = time.monotonic()
        if self.alive():
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=STOP_WAIT_S)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(timeout=STOP_WAIT_S)
        if self.proc.stdout is not None:
            self._drain.join(timeout=STOP_WAIT_S)
            self.proc.stdout.close()
        return self.proc.returncode, time.monotonic() - t0


def pid_gone(pid):
    """True when no process `pid` exists (ours are reaped, so a zombie
    would mean we forgot one)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    return False


class Cluster:
    """A dispatcher and workers on 127.0.0.1. Use as a context manager or
    call stop(); stop() always stops everything it started and raises
    AssertionError when a process outlived it."""

    def __init__(self, work_dir, workers=1, dispatcher_args=(),
                 worker_args=(), heartbeat_ms=100, worker_timeout_ms=2000):
        self.work_dir = work_dir
        os.makedirs(work_dir, exist_ok=True)
        self.daemons = []
        self.workers = []
        self._worker_args = list(worker_args)
        self._hb = heartbeat_ms
        try:
            disp_dir = os.path.join(work_dir, "dispatcher")
            os.makedirs(disp_dir, exist_ok=True)
            self._disp_argv = [
                DISPATCHER, "--host", "127.0.0.1", "--work-dir", disp_dir,
                "--heartbeat-ms", str(heartbeat_ms),
                "--worker-timeout-ms", str(worker_timeout_ms),
                "--client-timeout-ms", "5000",
                "--client-stall-ms", "30000"] + list(dispatcher_args)
            self.dispatcher = self._spawn(
                "dispatcher", self._disp_argv + ["--port", "0"])
            self.addr = self.dispatcher.addr
            for _ in range(workers):
                self.add_worker()
            if workers:
                self.wait_workers(workers)
        except BaseException:
            self.stop(check=False)
            raise

    def _spawn(self, name, argv):
        d = Daemon(name, argv, self.work_dir)
        self.daemons.append(d)
        return d

    def add_worker(self):
        w = self._spawn("worker%d" % len(self.workers), [
            WORKER, "--dispatcher", self.addr, "--port", "0",
            "--host", "127.0.0.1", "--threads", "1",
            "--buffer-bytes", str(16 << 20),
            "--heartbeat-ms", str(self._hb)] + self._worker_args)
        self.workers.append(w)
        return w

    def restart_dispatcher(self):
        """SIGKILLs the dispatcher and starts a new one on its port and
        work directory: it replays its journal; the workers and clients
        reconnect to the same address."""
        self.dispatcher.kill(signal.SIGKILL)
        port = self.addr.rsplit(":", 1)[1]
        self.dispatcher = self._spawn(
            "dispatcher%d" % len(self.daemons),
            self._disp_argv + ["--port", port])
        assert self.dispatcher.addr == self.addr, (self.dispatcher.addr,
                                                   self.addr)
        return self.dispatcher

    def kill_worker(self, i=0, sig=signal.SIGKILL):
        """Kills worker i (SIGKILL by default, reaped) mid-whatever."""
        self.workers[i].kill(sig)
        return self.workers[i]

    def status(self):
        out = subprocess.run(
            [FERRYCTL, "status", "--dispatcher", self.addr, "--json"],
            capture_output=True, timeout=10, check=True)
        return json.loads(out.stdout)

    def wait_workers(self, n, timeout=WORKERS_WAIT_S):
        """Waits (bounded) until the dispatcher lists n alive workers."""
        deadline = time.monotonic() + timeout
        seen = 0
        while True:
            try:
                st = self.status()
                seen = sum(1 for w in st.get("workers", [])
                           if w.get("state") == "alive")
            except (subprocess.SubprocessError, ValueError):
                seen = 0
            if seen >= n:
                return seen
            if time.monotonic() > deadline:
                raise AssertionError(
                    "%d of %d workers registered within %.0f s:\n%s"
                    % (seen, n, timeout, self.logs()))
            # Workers register on their next heartbeat: ask again soon.
            time.sleep(0.02)

    def logs(self):
        return "\n".join("---- %s (%s)\n%s" % (d.name, d.log, d.tail())
                         for d in self.daemons)

    def stop(self, check=True):
        for d in reversed(self.daemons):  # workers first, then dispatcher
            try:
                d.stop()
            except Exception:  # keep stopping the others
                d.proc.kill()
                d.proc.wait(timeout=STOP_WAIT_S)
        left = [d.name for d in self.daemons
                if d.proc.poll() is None or not pid_gone(d.pid)]
        if check:
            assert not left, "daemons left alive: %s" % left

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.stop(check=exc[0] is None)


# ---- datasets ----------------------------------------------------------

def _varint(buf, pos):
    v = shift = 0
    while True:
        b = buf[pos]
        pos += 1
        v |= (b & 0x7F) << shift
        if b < 0x80:
            return v, pos
        shift += 7


def _fields(buf):
    """(field number, wire type, value) of a protobuf message; value is a
    memoryview for length-delimited fields, an int for varints."""
    pos, end = 0, len(buf)
    while pos < end:
        key, pos = _varint(buf, pos)
        num, wt = key >> 3, key & 7
        if wt == 0:
            v, pos = _varint(buf, pos)
        elif wt == 2:
            n, pos = _varint(buf, pos)
            v = buf[pos:pos + n]
            pos += n
        elif wt == 1:
            v = buf[pos:pos + 8]
            pos += 8
        elif wt == 5:
            v = buf[pos:pos + 4]
            pos += 4
        else:
            raise ValueError("wire type %d" % wt)
        yield num, wt, v


def parse_example(data):
    """{key: bytes or [int...]} of a tf.train.Example with bytes and int64
    features (what ferryctl gen writes)."""
    out = {}
    for num, _, features in _fields(memoryview(data)):
        if num != 1:
            continue
        for fnum, _, entry in _fields(features):
            if fnum != 1:
                continue
            key = value = None
            for enum, _, ev in _fields(entry):
                if enum == 1:
                    key = bytes(ev).decode()
                elif enum == 2:
                    value = ev
            for knum, _, lst in _fields(value):
                if knum == 1:       # BytesList
                    out[key] = b"".join(bytes(v) for n, _, v in _fields(lst)
                                        if n == 1)
                elif knum == 3:     # Int64List (packed or not)
                    vals = []
                    for n, wt, v in _fields(lst):
                        if n != 1:
                            continue
                        if wt == 0:
                            vals.append(v)
                        else:
                            p = 0
                            while p < len(v):
                                x, p = _varint(v, p)
                                vals.append(x)
                    out[key] = [x - (1 << 64) if x >= 1 << 63 else x
                                for x in vals]
    return out


def read_tfrecord(path):
    """[(byte offset, record data)] of an uncompressed TFRecord file (CRCs
    not checked: the tests corrupt files on purpose)."""
    recs = []
    with open(path, "rb") as f:
        data = f.read()
    pos = 0
    while pos < len(data):
        (n,) = struct.unpack_from("<Q", data, pos)
        recs.append((pos, data[pos + 12:pos + 12 + n]))
        pos += 12 + n + 4
    return recs


class Dataset:
    """A dataset made by `ferryctl gen`, read back: per file (sorted, the
    dispatcher's file index order) the records' offsets, images and
    labels. Record ids are file_index << 40 | record_index."""

    def __init__(self, out_dir, shards, records, size=(8, 8), channels=3,
                 seed=7):
        self.dir = out_dir
        self.h, self.w = size
        self.c = channels
        subprocess.run(
            [FERRYCTL, "gen", "--out", out_dir, "--shards", str(shards),
             "--records", str(records), "--size", "%dx%d" % size,
             "--channels", str(channels), "--seed", str(seed)],
            check=True, capture_output=True, timeout=120)
        self.files = sorted(os.path.join(out_dir, f)
                            for f in os.listdir(out_dir)
                            if f.endswith(".tfrecord"))
        assert len(self.files) == shards, self.files
        self.offsets = []   # [file][record] -> byte offset
        self.images = {}    # id -> image bytes (h*w*c)
        self.labels = {}    # id -> label
        for fi, path in enumerate(self.files):
            offs = []
            for ri, (off, data) in enumerate(read_tfrecord(path)):
                ex = parse_example(data)
                rid = fi << 40 | ri
                self.images[rid] = ex["image"]
                self.labels[rid] = ex["label"][0]
                offs.append(off)
            self.offsets.append(offs)
        assert len(self.images) == records

    @property
    def pattern(self):
        return os.path.join(self.dir, "*.tfrecord")

    def spec(self, batch=None):
        s = 'tfrecord("%s") | decode(raw, %d, %d, %d)' % (
            self.pattern, self.h, self.w, self.c)
        if batch:
            s += " | batch(%d)" % batch
        return s

    def ids(self):
        return set(self.images)

    def __len__(self):
        return len(self.images)

    def image_bytes(self, ids):
        return b"".join(self.images[int(i)] for i in ids)


def assert_exactly_once(counts, expected, what="epoch"):
    """counts: Counter of ids seen; expected: set of ids."""
    dup = {i: n for i, n in counts.items() if n != 1}
    missing = expected - set(counts)
    extra = set(counts) - expected
    assert not dup and not missing and not extra, (
        "%s: %d ids seen more than once (e.g. %s), %d missing (e.g. %s), "
        "%d unknown (e.g. %s)" % (
            what, len(dup), sorted(dup)[:5], len(missing),
            [(i >> 40, i & ((1 << 40) - 1)) for i in sorted(missing)[:5]],
            len(extra), sorted(extra)[:5]))


def in_threads(fns, timeout, name="rank"):
    """Runs each callable of `fns` in a thread of its own (rank0, rank1,
    ...: ranks of one job read together, as one cannot start an epoch
    before the others finished theirs) and waits for all, at most
    `timeout` seconds each. Returns their results in order; fails naming
    the threads that hang or raised."""
    out = [None] * len(fns)

    def run(i):
        try:
            out[i] = (True, fns[i]())
        except BaseException as e:  # noqa: B902 - reported below
            out[i] = (False, e)

    ts = [threading.Thread(target=run, args=(i,), name="%s%d" % (name, i))
          for i in range(len(fns))]
    for t in ts:
        t.start()
    for t in ts:
        t.join(timeout)
    hung = [t.name for t in ts if t.is_alive()]
    assert not hung, "%s hang" % ", ".join(hung)
    failed = ["%s%d: %r" % (name, i, r[1]) for i, r in enumerate(out)
              if not r[0]]
    assert not failed, "\n".join(failed)
    return [r[1] for r in out]


def wait_progress(p, out_dir, ranks, n, deadline, what="steps"):
    """Waits (bounded by `deadline`, time.monotonic()) until the files
    out_dir/progress.R (R < ranks), one line per step, hold n lines in
    all; returns how many they had. Fails when the launcher `p` ended
    first."""
    while True:
        seen = 0
        for r in range(ranks):
            try:
                with open(os.path.join(out_dir, "progress.%d" % r)) as f:
                    seen += sum(1 for _ in f)
            except FileNotFoundError:
                pass
        assert p.poll() is None, (
            "the launcher ended (exit %s) after %d %s, before the fault at "
            "%d" % (p.returncode, seen, what, n))
        if seen >= n:
            return seen
        assert time.monotonic() < deadline, (
            "%d of %d %s before the deadline" % (seen, n, what))
        time.sleep(0.01)


def fault_effects(cluster):
    """The dispatcher's log lines about splits restarted and workers lost:
    whether a fault hit work in flight (printed, not asserted: a random
    point may fall where no split is leased)."""
    try:
        with open(cluster.dispatcher.log, errors="replace") as f:
            return [ln.rstrip() for ln in f
                    if " restarts " in ln or " lost:" in ln
                    or " unreachable by job " in ln]
    except OSError:
        return []


FAULTS = ("worker", "dispatcher")


def inject(cluster, rng, kind):
    """The fault `kind` of FAULTS: a random worker SIGKILLed, or the
    dispatcher SIGKILLed and restarted on its journal. Returns what was
    done, for the test's output."""
    if kind == "dispatcher":
        cluster.restart_dispatcher()
        return "the dispatcher SIGKILLed and restarted"
    victim = rng.randrange(len(cluster.workers))
    cluster.kill_worker(victim)
    return "worker%d SIGKILLed" % victim


def free_ports(n):
    """n ports for launchers that cannot take port 0 (torchrun's
    --master_port, TF_CONFIG's hosts). A port a bind to 0 returned could
    be handed to another process (a bind to 0, an outgoing connection of
    a test running beside this one) before the launcher binds it: CI saw
    torchrun fail with "Address already in use". These are drawn at random
    from the 8,192 ports below the kernel's ephemeral range, which it never
    hands out by itself, and each is free when drawn."""
    try:
        with open("/proc/sys/net/ipv4/ip_local_port_range") as f:
            low = int(f.read().split()[0])
    except (OSError, ValueError, IndexError):
        low = 32768
    low = max(low, 1024 + 8192)
    draw = random.SystemRandom()
    ports = []
    for _ in range(64 * n + 1024):
        if len(ports) == n:
            return ports
        port = draw.randrange(low - 8192, low)
        if port in ports:
            continue
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
            try:
                s.bind(("127.0.0.1", port))
            except OSError:
                continue
        ports.append(port)
    if len(ports) == n:
        return ports
    raise RuntimeError("no %d free ports among %d to %d" % (n, low - 8192,
                                                            low - 1))


def run_launcher(argv, env, out_dir, log, ranks, timeout_s, cluster=None,
                 rng=None, total=0, fault_kind="worker", unit="steps",
                 cwd=None):
    """Runs a launcher (torchrun, mpirun) in a process group of its own,
    its output to `log`, for at most timeout_s. With `rng`: once its
    ranks took a random number of the run's `total` steps (their
    out_dir/progress.R files), injects the fault `fault_kind` into
    `cluster`. Whatever happens, no process of the group outlives this.
    Returns (exit status, the log's text, seconds, the fault or None)."""
    fault = None
    t0 = time.monotonic()
    with open(log, "wb") as logf:
        p = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=logf,
                             stderr=subprocess.STDOUT, env=env,
                             process_group=0, close_fds=True, cwd=cwd)
        try:
            if rng is not None:
                at = rng.randrange(1, total - 2 * ranks)
                seen = wait_progress(p, out_dir, ranks, at, t0 + timeout_s,
                                     unit)
                what = inject(cluster, rng, fault_kind)
                fault = ("%s after %d of %d %s (%.2f s into the run)"
                         % (what, seen, total, unit, time.monotonic() - t0))
                print(fault)
            rc = p.wait(timeout=max(1.0, timeout_s -
                                    (time.monotonic() - t0)))
        except BaseException:
            os.killpg(p.pid, signal.SIGKILL)
            p.wait(timeout=10)
            raise
        finally:
            try:
                os.killpg(p.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
    seconds = time.monotonic() - t0
    with open(log, "r", errors="replace") as f:
        out = f.read()
    return rc, out, seconds, fault
