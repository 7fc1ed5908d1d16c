"""PyTorch DistributedDataParallel over a ranked Ferry job:
torchrun starts four processes of ddp_rank.py on 127.0.0.1 (gloo, a free
port), each running docs/PYTHON.md's DDP loop as written: a linear layer
on the 8x8x3 images, two epochs, one all-reduce per step (DDP's backward).
ferry.Client takes each rank from torchrun's RANK/WORLD_SIZE. Every rank
must take the same number of steps per epoch, steps_per_epoch (a rank
short of one would hang the others' all-reduce, bounded here by the
process group's 60 s timeout and the run's), every real record of an
epoch (the first num_real of each batch: the default policy pads) must
reach exactly one rank, and the loss must go down. Then the same with one
of the two Ferry workers SIGKILLed after a random number of steps (the
seed is printed; FERRY_PY_SEED replays it).

Skipped, with the reason, where torch (Debian's python3-torch through the
venv's system site packages) or its gloo backend cannot be had.
"""
import collections
import json
import os
import random
import sys
import uuid

import pytest

import ferrytest

HERE = os.path.dirname(os.path.abspath(__file__))
RANKS = 4
BATCH = 8          # the doc's loop: batch_size=8, epochs=2
EPOCHS = 2
# 6 files of 50 records: each rank's share under padding (75 records, 10
# steps of 8, the last with 3 real) ends inside a file, so two ranks
# share it: the dispatcher's plan gives the later rank its first part and
# the earlier one its last, so lockstep ranks never wait on each other.
SHARDS, RECORDS = 6, 300
RUN_TIMEOUT_S = 240       # torchrun and its four ranks, all of it
SLEEP_MS = 30             # per step in the fault run: room for the fault
LAUNCHERS = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "HOROVOD_RANK",
             "HOROVOD_SIZE", "OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE",
             "TF_CONFIG", "MASTER_ADDR", "MASTER_PORT")


@pytest.fixture
def dist_torch(torch):
    import torch.distributed as dist
    if not dist.is_available() or not dist.is_gloo_available():
        pytest.skip("torch %s has no torch.distributed gloo backend"
                    % torch.__version__)
    return torch


@pytest.fixture(scope="module")
def ddp_data(tmp_path_factory):
    return ferrytest.Dataset(str(tmp_path_factory.mktemp("ddp")), SHARDS,
                             RECORDS)


def free_port():
    return ferrytest.free_ports(1)[0]


def expected_steps():
    return -(-RECORDS // (RANKS * BATCH))   # padding: ceil


def run_torchrun(cluster, data, out_dir, rng=None, fault_kind="worker"):
    """torchrun --nproc_per_node 4 ddp_rank.py; with rng, SIGKILLs one of
    the cluster's workers after a random number of steps taken over all
    ranks. Returns ({rank: result}, seconds, fault or None)."""
    os.makedirs(out_dir)
    port = free_port()
    argv = [sys.executable, "-m", "torch.distributed.run",
            "--nnodes", "1", "--nproc_per_node", str(RANKS),
            "--master_addr", "127.0.0.1", "--master_port", str(port),
            "--max_restarts", "0", "--monitor_interval", "0.2",
            # Debian's torch 1.13 on Python 3.11 cannot parse the default
            # "0" of --redirects/--tee (AttributeError: 'NoneType' object
            # has no attribute 'get'): 2 and 1 (stderr to the log files,
            # stdout there and to ours) are parsed.
            "--log_dir", os.path.join(out_dir, "logs"),
            "--redirects", "2", "--tee", "1",
            os.path.join(HERE, "ddp_rank.py"),
            "--dispatcher", cluster.addr, "--pattern", data.pattern,
            "--job", "ddp-" + uuid.uuid4().hex[:8], "--out", out_dir,
            "--sleep-ms", str(SLEEP_MS if rng else 0)]
    env = {k: v for k, v in os.environ.items() if k not in LAUNCHERS}
    env.update(GLOO_SOCKET_IFNAME="lo", OMP_NUM_THREADS="1",
               PYTHONDONTWRITEBYTECODE="1")
    rc, out, seconds, fault = ferrytest.run_launcher(
        argv, env, out_dir, os.path.join(out_dir, "torchrun.log"), RANKS,
        RUN_TIMEOUT_S, cluster, rng, RANKS * EPOCHS * expected_steps(),
        fault_kind, cwd=out_dir)
    results = {}
    errors = []
    for r in range(RANKS):
        path = os.path.join(out_dir, "rank%d.json" % r)
        if not os.path.exists(path):
            errors.append("rank %d wrote no result" % r)
            continue
        with open(path) as f:
            results[r] = json.load(f)
        if "error" in results[r]:
            errors.append("rank %d failed:\n%s" % (r, results[r]["error"]))
    assert not errors, "%s\ntorchrun exit %s:\n%s\n%s" % (
        "\n".join(errors), rc, out[-4000:], cluster.logs())
    assert rc == 0, "torchrun exited %s:\n%s" % (rc, out[-4000:])
    return results, seconds, fault


def check_ddp(results, data):
    s = expected_steps()
    lines = []
    for r, res in sorted(results.items()):
        # The rank came from torchrun's environment, not from arguments.
        assert (res["env_rank"], res["env_world"]) == (r, RANKS), res
        assert (res["rank"], res["world_size"]) == (r, RANKS), res
        assert res["steps_per_epoch"] == s and res["dropped_per_epoch"] == 0
        steps = [res["epochs"].get(str(e), {}).get("steps", 0)
                 for e in range(EPOCHS)]
        assert steps == [s] * EPOCHS, (r, steps, s)
        printed = [(p["epoch"], p["steps"]) for p in res["printed"]]
        assert printed == [(e, s) for e in range(EPOCHS)], (r, printed)
        lines.append("rank %d: steps %s, losses %s (%.1f s)" % (
            r, steps, ["%.4f" % p["loss"] for p in res["printed"]],
            res["seconds"]))
        for e in range(EPOCHS):
            ep = res["epochs"][str(e)]
            assert set(ep["sizes"]) == {BATCH}, (r, e, ep["sizes"])
            assert [p["records"] for p in res["printed"]
                    if p["epoch"] == e] == [len(ep["real"])]
            if ep["real"]:   # padding repeats the rank's own records
                assert set(ep["padded"]) <= set(ep["real"]), (r, e)
    print("\n".join(lines))
    for e in range(EPOCHS):
        counts = collections.Counter()
        for res in results.values():
            counts.update(res["epochs"][str(e)]["real"])
        ferrytest.assert_exactly_once(counts, data.ids(), "epoch %d" % e)
    # The loss goes down: the mean over every rank's real records.
    means = []
    for e in range(EPOCHS):
        ps = [p for res in results.values() for p in res["printed"]
              if p["epoch"] == e]
        means.append(sum(p["loss"] * p["records"] for p in ps)
                     / sum(p["records"] for p in ps))
    print("mean loss per epoch: %s" % ["%.4f" % m for m in means])
    assert means[1] < means[0] - 0.05, means


def test_ddp_torchrun(dist_torch, make_cluster, ddp_data, tmp_path):
    cluster = make_cluster(workers=2)
    results, secs, _ = run_torchrun(cluster, ddp_data, str(tmp_path / "out"))
    print("torchrun --nproc_per_node %d, %d records, batch %d, pad: %.1f s"
          % (RANKS, RECORDS, BATCH, secs))
    check_ddp(results, ddp_data)


def test_ddp_torchrun_worker_killed(dist_torch, make_cluster, ddp_data,
                                    tmp_path):
    seed = int(os.environ.get("FERRY_PY_SEED",
                              random.SystemRandom().randrange(1 << 32)))
    print("seed %d (FERRY_PY_SEED=%d replays it)" % (seed, seed))
    cluster = make_cluster(workers=2)
    results, secs, fault = run_torchrun(cluster, ddp_data,
                                        str(tmp_path / "out"),
                                        rng=random.Random(seed))
    print("torchrun --nproc_per_node %d, %d records, batch %d, pad, %s: "
          "%.1f s" % (RANKS, RECORDS, BATCH, fault, secs))
    check_ddp(results, ddp_data)


def test_ddp_torchrun_dispatcher_restarted(dist_torch, make_cluster,
                                           ddp_data, tmp_path):
    seed = int(os.environ.get("FERRY_PY_SEED",
                              random.SystemRandom().randrange(1 << 32)))
    print("seed %d (FERRY_PY_SEED=%d replays it)" % (seed, seed))
    cluster = make_cluster(workers=2)
    results, secs, fault = run_torchrun(cluster, ddp_data,
                                        str(tmp_path / "out"),
                                        rng=random.Random(seed),
                                        fault_kind="dispatcher")
    print("torchrun --nproc_per_node %d, %d records, batch %d, pad, %s: "
          "%.1f s" % (RANKS, RECORDS, BATCH, fault, secs))
    check_ddp(results, ddp_data)
