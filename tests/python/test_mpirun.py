"""Ranks launched by Open MPI: `mpirun -np 4` starts
four processes of mpi_rank.py, each a ferry.Client that takes its rank
and world size from OMPI_COMM_WORLD_RANK / OMPI_COMM_WORLD_SIZE (no MPI
call, no mpi4py: the ranks exchange nothing, each writes a JSON file).
Every rank must take the same number of steps per epoch, steps_per_epoch,
each of exactly batch_size records, and every record of an epoch must
reach exactly one rank (drop_remainder: the last partial round dropped;
padding: the real records of each batch first, the padding repeats the
rank's own records). Then the same with one of the two Ferry workers
SIGKILLed at a random point of the run (seeded, printed: FERRY_PY_SEED
replays it).

Horovod's launcher would set HOROVOD_RANK/SIZE instead; Horovod has no
wheel in the registries (only an sdist built against a framework), so
Open MPI's mpirun (Debian's openmpi-bin, deploy/install-deps.sh) stands
in. Skipped, with the reason, where mpirun or the ranks API is missing.
"""
import collections
import json
import os
import random
import shutil
import sys
import uuid

import pytest

import ferry
import ferrytest

HERE = os.path.dirname(os.path.abspath(__file__))
RANKS = 4
BATCH = 8
RECORDS = 300          # 9 full rounds of 4 x 8 and 12 records over
EPOCHS = 2
RUN_TIMEOUT_S = 120    # mpirun and its ranks, all of it
SLEEP_MS = 20          # per batch: the run lasts long enough to be hit
# The launcher variables that would win over Open MPI's (first set wins).
OTHER_LAUNCHERS = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "HOROVOD_RANK",
                   "HOROVOD_SIZE", "TF_CONFIG")


def ranks_api_missing():
    """None when ferry.Client takes rank/world_size, else the reason."""
    try:
        c = ferry.Client("127.0.0.1:1", "x", rank=0, world_size=1,
                         timeout=0.5)
    except TypeError as e:
        msg = str(e)
        if "rank" in msg or "world_size" in msg:
            return ("ferry.Client has no rank/world_size parameter (%s): "
                    "the ranks API is not in this build" % msg)
        return None
    except Exception:  # SpecError, UnreachableError: the keywords exist
        return None
    c.close()
    return None


@pytest.fixture(scope="module")
def ranks_data(tmp_path_factory):
    return ferrytest.Dataset(str(tmp_path_factory.mktemp("mpi")), 6, RECORDS)


@pytest.fixture
def mpirun():
    path = shutil.which("mpirun")
    if path is None:
        pytest.skip("mpirun not found: install Debian's openmpi-bin "
                    "(deploy/install-deps.sh)")
    why = ranks_api_missing()
    if why:
        pytest.skip(why)
    return path


def expected_steps(drop, n=RECORDS, ranks=RANKS, batch=BATCH):
    rnd = ranks * batch
    return n // rnd if drop else -(-n // rnd)


def run_ranks(mpirun, cluster, data, out_dir, drop, rng=None,
              fault_kind="worker"):
    """Runs mpirun; with rng, SIGKILLs one worker after a random number of
    batches taken over all ranks. Returns ({rank: result}, seconds,
    fault description or None)."""
    os.makedirs(out_dir)
    job = "mpi-" + uuid.uuid4().hex[:8]
    argv = [mpirun, "--allow-run-as-root", "--oversubscribe",
            "-np", str(RANKS),
            "--mca", "btl", "self,tcp", "--mca", "btl_tcp_if_include", "lo",
            "--mca", "pml", "ob1",
            sys.executable, os.path.join(HERE, "mpi_rank.py"),
            "--dispatcher", cluster.addr, "--spec", data.spec(),
            "--job", job, "--batch-size", str(BATCH),
            "--epochs", str(EPOCHS), "--drop" if drop else "--pad",
            "--out", out_dir, "--sleep-ms", str(SLEEP_MS if rng else 0),
            "--timeout", "30"]
    env = {k: v for k, v in os.environ.items() if k not in OTHER_LAUNCHERS}
    rc, out, seconds, fault = ferrytest.run_launcher(
        argv, env, out_dir, os.path.join(out_dir, "mpirun.log"), RANKS,
        RUN_TIMEOUT_S, cluster, rng, RANKS * EPOCHS * expected_steps(drop),
        fault_kind, unit="batches")
    results = {}
    for r in range(RANKS):
        path = os.path.join(out_dir, "rank%d.json" % r)
        assert os.path.exists(path), (
            "rank %d wrote no result (mpirun exit %s):\n%s\n%s"
            % (r, rc, out[-4000:], cluster.logs()))
        with open(path) as f:
            results[r] = json.load(f)
        assert "error" not in results[r], (
            "rank %d failed:\n%s\nmpirun:\n%s\n%s"
            % (r, results[r]["error"], out[-4000:], cluster.logs()))
    assert rc == 0, "mpirun exited %s:\n%s" % (rc, out[-4000:])
    return results, seconds, fault


def check_ranks(results, data, drop):
    """Equal steps, full batches, each record of an epoch once."""
    s = expected_steps(drop)
    dropped = RECORDS - s * RANKS * BATCH if drop else 0
    epochs = sorted({e for r in results.values() for e in r["epochs"]},
                    key=int)
    assert len(epochs) == EPOCHS, epochs
    lines = []
    for r, res in sorted(results.items()):
        assert res["env_rank"] == r and res["env_size"] == RANKS, res
        # The client's own view of the rank it took from the environment.
        assert (res["rank"], res["world_size"]) == (r, RANKS), (
            r, res["rank"], res["world_size"])
        assert res["steps_per_epoch"] == s, (r, res["steps_per_epoch"], s)
        assert res["dropped_per_epoch"] == dropped, (
            r, res["dropped_per_epoch"], dropped)
        steps = [res["epochs"].get(e, {}).get("steps", 0) for e in epochs]
        lines.append("rank %d: steps per epoch %s (%.1f s)"
                     % (r, steps, res["seconds"]))
        assert steps == [s] * EPOCHS, (r, steps, s)
        for e in epochs:
            sizes = res["epochs"][e]["sizes"]
            assert set(sizes) == {BATCH}, (r, e, sorted(set(sizes)))
    print("\n".join(lines))
    for e in epochs:
        counts = collections.Counter()
        for r, res in results.items():
            ep = res["epochs"][e]
            counts.update(ep["real"])
            # Padding repeats the rank's own records of the epoch.
            assert set(ep["padded"]) <= set(ep["real"]) or not ep["real"], (
                "epoch %s rank %d pads with another rank's records" % (e, r))
            if drop:
                assert not ep["padded"], (e, r, len(ep["padded"]))
        if drop:
            dup = [i for i, c in counts.items() if c != 1]
            assert not dup, "epoch %s: %d ids twice" % (e, len(dup))
            assert set(counts) <= data.ids()
            assert len(counts) == RECORDS - dropped, (len(counts), dropped)
        else:
            ferrytest.assert_exactly_once(counts, data.ids(),
                                          "epoch %s" % e)


@pytest.mark.parametrize("drop", [True, False], ids=["drop", "pad"])
def test_mpirun_ranks(mpirun, make_cluster, ranks_data, tmp_path, drop):
    cluster = make_cluster(workers=2)
    results, secs, _ = run_ranks(mpirun, cluster, ranks_data,
                                 str(tmp_path / "out"), drop)
    print("mpirun -np %d, %d records, batch %d, %s: %.1f s"
          % (RANKS, RECORDS, BATCH, "drop" if drop else "pad", secs))
    check_ranks(results, ranks_data, drop)


@pytest.mark.parametrize("kind", ferrytest.FAULTS)
@pytest.mark.parametrize("drop", [True, False], ids=["drop", "pad"])
def test_mpirun_fault(mpirun, make_cluster, ranks_data, tmp_path, drop,
                      kind):
    seed = int(os.environ.get("FERRY_PY_SEED",
                              random.SystemRandom().randrange(1 << 32)))
    print("seed %d (FERRY_PY_SEED=%d replays it)" % (seed, seed))
    cluster = make_cluster(workers=2)
    results, secs, fault = run_ranks(mpirun, cluster, ranks_data,
                                     str(tmp_path / "out"), drop,
                                     rng=random.Random(seed),
                                     fault_kind=kind)
    print("mpirun -np %d, %d records, batch %d, %s, %s: %.1f s"
          % (RANKS, RECORDS, BATCH, "drop" if drop else "pad", fault, secs))
    effects = ferrytest.fault_effects(cluster)
    print("dispatcher log: %d split restart(s) or lost/unreachable "
          "worker line(s) after the fault%s"
          % (len(effects), "".join("\n  " + ln for ln in effects)))
    check_ranks(results, ranks_data, drop)
