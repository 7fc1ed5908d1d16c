"""Fork safety: a process that forks after creating a Client (PyTorch's
DataLoader forks its workers) must not break either side. The child used
to run ferry_client_free from its finalizer: a goodbye heartbeat on the
parent's gRPC channel and joins of threads it does not have; it died of
SIGSEGV or hung at exit, and the parent's client stopped mid-epoch.

Each test runs a trainer script in a subprocess (so the child's exit is a
real interpreter exit, finalizers and all): it reads some batches, forks,
and the parent finishes the epoch while the child either just exits or
first tries the inherited client (ferry.ForkedError, at once) and a new
one (refused: gRPC cannot run in a child forked while it ran). Every wait
is bounded."""
import collections
import json
import subprocess
import sys

import pytest

import ferrytest

SCRIPT = r'''
import json, os, sys, time
import numpy
import ferry

addr, spec, mode = sys.argv[1:4]
c = ferry.Client(addr, spec, timeout=30, prefetch=2)
it = iter(c)
ids = []
for _ in range(10):
    b = next(it)
    ids.extend(numpy.asarray(b.ids).tolist())
    del b
parent = os.getpid()
pid = os.fork()
if pid == 0:
    if mode == "next":
        t0 = time.monotonic()
        try:
            c.next(timeout=5)
            print("child: next() returned a batch", file=sys.stderr)
            os._exit(3)
        except ferry.ForkedError as e:
            want = "created in process %d; a forked child cannot use it" % parent
            if want not in str(e) or e.code_name != "EFORKED":
                print("child: wrong error: %r %s" % (e, e.code_name),
                      file=sys.stderr)
                os._exit(4)
        if time.monotonic() - t0 > 1.0:
            os._exit(5)
        try:
            ferry.Client(addr, spec, timeout=5)
            os._exit(6)
        except ferry.ForkedError as e:
            if "'spawn'" not in str(e):
                os._exit(7)
        try:
            c.stats()
            os._exit(8)
        except ferry.ForkedError:
            pass
    # A normal exit: the interpreter's finalization frees the inherited
    # client (and the iterator), as a DataLoader worker's exit did.
    sys.exit(0)
for b in it:
    ids.extend(numpy.asarray(b.ids).tolist())
    del b
status = None
t0 = time.monotonic()
while time.monotonic() - t0 < 30:
    p, st = os.waitpid(pid, os.WNOHANG)
    if p == pid:
        status = st
        break
    time.sleep(0.01)
else:
    os.kill(pid, 9)
    os.waitpid(pid, 0)
c.close()
print(json.dumps({"ids": ids, "child": status}))
'''


@pytest.mark.parametrize("mode", ["exit", "next"])
def test_fork_mid_epoch_leaves_both_sides_working(make_cluster, medium,
                                                  mode):
    cl = make_cluster(workers=2)
    r = subprocess.run([sys.executable, "-c", SCRIPT, cl.addr,
                        medium.spec(batch=50), mode],
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, (
        "the parent trainer failed (rc %d): %s" % (r.returncode,
                                                   r.stderr[-3000:]))
    out = json.loads(r.stdout.strip().splitlines()[-1])
    st = out["child"]
    assert st is not None, "the forked child hung at exit (killed after " \
        "30 s): %s" % r.stderr[-2000:]
    assert st == 0, "the forked child ended with status 0x%x (exit %d, " \
        "signal %d): %s" % (st, st >> 8, st & 0x7f, r.stderr[-2000:])
    ferrytest.assert_exactly_once(collections.Counter(out["ids"]),
                                  medium.ids())
