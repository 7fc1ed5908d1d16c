"""A DDP job restarted from its checkpoint resumes its input exactly
(with the ranks' group restart): torchrun (--max_restarts 1)
runs four ranks of resume_rank.py, DistributedDataParallel over gloo on a
ranked Ferry job in deterministic order, rank 0 saving the model and
ds.state_dict() every 3 steps. A reference run goes through its two
epochs untouched; in the fault run one rank process is SIGKILLed at a
random step after the first checkpoint (seeded, printed: FERRY_PY_SEED
replays it), torchrun restarts every rank, and each loads the checkpoint
and resumes the job at its cursor. Each rank's batches (SHA-256 of images
and ids) up to the checkpoint in the first attempt, then those of the
second, must be the reference's, every step once, and every record of
each epoch must reach exactly one rank (the padding aside).

Skipped, with the reason, where torch or its gloo backend cannot be had.
"""
import collections
import os
import random
import signal
import sys
import time
import uuid

import pytest

import ferrytest
from test_ddp import LAUNCHERS, dist_torch, free_port  # noqa: F401

HERE = os.path.dirname(os.path.abspath(__file__))
RANKS = 4
EVERY = 3
STEPS = 2 * -(-300 // (RANKS * 8))   # two epochs of 300, batch 8: 20
RUN_TIMEOUT_S = 240


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    return ferrytest.Dataset(str(tmp_path_factory.mktemp("resume")), 6, 300)


def read_digests(out_dir, rank, attempt):
    try:
        with open(os.path.join(out_dir, "digests.%d.%d" % (rank, attempt))) \
                as f:
            return [ln.split() for ln in f]
    except FileNotFoundError:
        return []


def run(cluster, data, out_dir, rng=None):
    """torchrun of RANKS resume_rank.py; with rng, SIGKILLs a random rank
    at a random step after the first checkpoint. Returns the fault."""
    os.makedirs(out_dir)
    argv = [sys.executable, "-m", "torch.distributed.run",
            "--nnodes", "1", "--nproc_per_node", str(RANKS),
            "--master_addr", "127.0.0.1", "--master_port", str(free_port()),
            "--max_restarts", "1" if rng else "0",
            "--monitor_interval", "0.2",
            "--log_dir", os.path.join(out_dir, "logs"),
            "--redirects", "2", "--tee", "1",   # see test_ddp.py
            os.path.join(HERE, "resume_rank.py"),
            "--dispatcher", cluster.addr, "--pattern", data.pattern,
            "--job", "resume-" + uuid.uuid4().hex[:8], "--out", out_dir,
            "--every", str(EVERY), "--sleep-ms", "30" if rng else "0"]
    env = {k: v for k, v in os.environ.items() if k not in LAUNCHERS}
    env.update(GLOO_SOCKET_IFNAME="lo", OMP_NUM_THREADS="1",
               PYTHONDONTWRITEBYTECODE="1")
    fault = None
    log = os.path.join(out_dir, "torchrun.log")
    t0 = time.monotonic()
    with open(log, "wb") as logf:
        p = ferrytest.subprocess.Popen(
            argv, stdin=ferrytest.subprocess.DEVNULL, stdout=logf,
            stderr=ferrytest.subprocess.STDOUT, env=env, process_group=0,
            close_fds=True, cwd=out_dir)
        try:
            if rng is not None:
                at = rng.randrange(EVERY + 1, STEPS - 1)
                victim = rng.randrange(RANKS)
                # Every rank past step `at` (one line per step each).
                ferrytest.wait_progress(p, out_dir, RANKS, RANKS * at,
                                        t0 + RUN_TIMEOUT_S)
                with open(os.path.join(out_dir, "pid.%d" % victim)) as f:
                    os.kill(int(f.read()), signal.SIGKILL)
                fault = "rank %d SIGKILLed at step %d of %d" % (
                    victim, at, STEPS)
                print(fault)
            rc = p.wait(timeout=max(1.0, RUN_TIMEOUT_S -
                                    (time.monotonic() - t0)))
        finally:
            try:
                os.killpg(p.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            p.wait(timeout=10)
    with open(log, errors="replace") as f:
        out = f.read()
    assert rc == 0, "torchrun exited %s:\n%s\n%s" % (rc, out[-4000:],
                                                      cluster.logs())
    return fault


def test_ddp_restart_resumes_at_the_checkpoint(dist_torch, make_cluster,
                                               data, tmp_path):
    seed = int(os.environ.get("FERRY_PY_SEED",
                              random.SystemRandom().randrange(1 << 32)))
    print("seed %d (FERRY_PY_SEED=%d replays it)" % (seed, seed))
    ref_dir = str(tmp_path / "ref")
    run(make_cluster(workers=2), data, ref_dir)
    ref = {r: read_digests(ref_dir, r, 0) for r in range(RANKS)}
    for r in range(RANKS):
        assert [int(x[0]) for x in ref[r]] == list(range(1, STEPS + 1)), r
    out = str(tmp_path / "fault")
    run(make_cluster(workers=2), data, out, random.Random(seed))
    with open(os.path.join(out, "ckpt.pt"), "rb"):
        pass
    runs = []
    for r in range(RANKS):
        first = read_digests(out, r, 0)
        second = read_digests(out, r, 1)
        assert second, "rank %d was not restarted" % r
        resumed_at = int(second[0][0]) - 1
        assert resumed_at % EVERY == 0 and resumed_at >= EVERY, resumed_at
        got = [x for x in first if int(x[0]) <= resumed_at] + second
        print("rank %d: %d steps before the restart (checkpoint at %d), "
              "%d after" % (r, len(first), resumed_at, len(second)))
        assert got == ref[r], (
            "rank %d: the restarted run's batches differ from the "
            "reference's" % r)
        runs.append(got)
    for e in range(2):
        counts = collections.Counter(
            int(i) for got in runs for x in got if int(x[1]) == e
            and x[4] != "-" for i in x[4].split(","))
        ferrytest.assert_exactly_once(counts, data.ids(), "epoch %d" % e)
