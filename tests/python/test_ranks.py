"""Ranks: ferry.Client(rank=, world_size=) and the launcher's
environment (ferry.launcher_rank()), then ranked jobs of four clients in
threads against a local cluster: every rank the same number of batches,
steps_per_epoch, each of exactly batch_size records; under padding every
real record of an epoch (the first num_real of each batch) reaches one
rank once, under drop_remainder all but dropped_per_epoch of them do; and
the dispatcher's refusals (a rank held twice, ranks that disagree) name
both clients."""
import collections
import json
import re
import threading
import uuid

import numpy
import pytest

import ferry
import ferrytest

TIMEOUT = 30.0
RANKS = 4
BATCH = 8
RECORDS = 300   # 9 full rounds of 4 x 8 = 32 records and 12 left over
EPOCHS = 2
NOWHERE = "127.0.0.1:1"  # nothing listens: argument errors come first


@pytest.fixture
def clean_env(monkeypatch):
    """No launcher variable of the machine running the suite leaks in."""
    for v in ferry._launcher.LAUNCHER_VARIABLES:
        monkeypatch.delenv(v, raising=False)
    return monkeypatch


# ---- launcher_rank: the environment's rules -----------------------------

def tf_config(cluster, kind, index):
    return json.dumps({"cluster": cluster, "task": {"type": kind,
                                                    "index": index}})


def test_no_launcher(clean_env):
    assert ferry.launcher_rank() is None


@pytest.mark.parametrize("rvar,wvar,who", [
    ("RANK", "WORLD_SIZE", "torchrun"),
    ("HOROVOD_RANK", "HOROVOD_SIZE", "Horovod"),
    ("OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE", "Open MPI"),
])
def test_launcher_pairs(clean_env, rvar, wvar, who):
    clean_env.setenv(rvar, "2")
    clean_env.setenv(wvar, " 4 ")
    got = ferry.launcher_rank()
    assert got == (2, 4, "%s/%s (%s)" % (rvar, wvar, who))
    rank, world, source = got  # a plain tuple too
    assert (got.rank, got.world_size, got.source) == (rank, world, source)
    # Half a pair, a non-integer, a rank outside the world: ValueError
    # naming the variables.
    clean_env.delenv(wvar)
    with pytest.raises(ValueError, match="%s is not" % wvar):
        ferry.launcher_rank()
    clean_env.setenv(wvar, "four")
    with pytest.raises(ValueError, match=wvar):
        ferry.launcher_rank()
    clean_env.setenv(wvar, "2")
    with pytest.raises(ValueError, match="rank 2 is not in 0 .. 1"):
        ferry.launcher_rank()
    clean_env.setenv(wvar, "1")
    clean_env.setenv(rvar, "0")
    assert ferry.launcher_rank() == (0, 1, "%s/%s (%s)" % (rvar, wvar, who))


def test_tf_config(clean_env):
    with_chief = {"chief": ["h0:1"], "worker": ["h1:1", "h2:1", "h3:1"],
                  "ps": ["p:1"], "evaluator": ["e:1"]}
    for kind, index, rank in (("chief", 0, 0), ("worker", 0, 1),
                              ("worker", 2, 3)):
        clean_env.setenv("TF_CONFIG", tf_config(with_chief, kind, index))
        got = ferry.launcher_rank()
        assert (got.rank, got.world_size) == (rank, 4), (kind, index, got)
        assert got.source == "TF_CONFIG (%s %d)" % (kind, index)
    no_chief = {"worker": ["h1:1", "h2:1", "h3:1"]}
    clean_env.setenv("TF_CONFIG", tf_config(no_chief, "worker", 1))
    assert ferry.launcher_rank()[:2] == (1, 3)
    clean_env.setenv("TF_CONFIG", tf_config(no_chief, "worker", "2"))
    assert ferry.launcher_rank()[:2] == (2, 3)
    # Tasks that train nothing have no rank.
    for kind in ("evaluator", "ps"):
        clean_env.setenv("TF_CONFIG", tf_config(with_chief, kind, 0))
        assert ferry.launcher_rank() is None, kind
    clean_env.setenv("TF_CONFIG", json.dumps({"cluster": no_chief}))
    assert ferry.launcher_rank() is None
    clean_env.setenv("TF_CONFIG", "")
    assert ferry.launcher_rank() is None
    for bad, what in (("{not json", "not JSON"),
                      ("[1, 2]", "not a JSON object"),
                      (tf_config(no_chief, "worker", 3), "not in the"),
                      (tf_config(no_chief, "chief", 0), "not in the"),
                      (tf_config({"worker": "h1:1"}, "worker", 0),
                       "must be a list"),
                      (tf_config(no_chief, "worker", 1.5), "not an integer")):
        clean_env.setenv("TF_CONFIG", bad)
        with pytest.raises(ValueError, match=what):
            ferry.launcher_rank()


def test_launcher_precedence(clean_env):
    """torchrun, then Horovod, then Open MPI, then TF_CONFIG: the first set
    wins."""
    clean_env.setenv("TF_CONFIG", tf_config({"worker": ["a", "b", "c", "d",
                                                        "e"]}, "worker", 4))
    clean_env.setenv("OMPI_COMM_WORLD_RANK", "3")
    clean_env.setenv("OMPI_COMM_WORLD_SIZE", "4")
    clean_env.setenv("HOROVOD_RANK", "2")
    clean_env.setenv("HOROVOD_SIZE", "3")
    clean_env.setenv("RANK", "1")
    clean_env.setenv("WORLD_SIZE", "2")
    order = [("RANK", "WORLD_SIZE", (1, 2)),
             ("HOROVOD_RANK", "HOROVOD_SIZE", (2, 3)),
             ("OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE", (3, 4)),
             ("TF_CONFIG", None, (4, 5))]
    for rvar, wvar, want in order:
        got = ferry.launcher_rank()
        assert got[:2] == want and rvar in got.source, (got, rvar)
        clean_env.delenv(rvar)
        if wvar:
            clean_env.delenv(wvar)
    assert ferry.launcher_rank() is None


def test_environ_argument(clean_env):
    env = {"HOROVOD_RANK": "0", "HOROVOD_SIZE": "2"}
    assert ferry.launcher_rank(env) == (0, 2, "HOROVOD_RANK/HOROVOD_SIZE "
                                              "(Horovod)")


# ---- Client arguments (checked before anything is sent) -----------------

def test_env_rank_needs_job_name(clean_env, small):
    clean_env.setenv("RANK", "1")
    clean_env.setenv("WORLD_SIZE", "4")
    with pytest.raises(ValueError) as e:
        ferry.Client(NOWHERE, small.spec(batch=8), timeout=1)
    msg = str(e.value)
    print(msg)
    assert "RANK/WORLD_SIZE (torchrun)" in msg and "job_name" in msg
    assert "rank 1 of 4" in msg
    clean_env.delenv("RANK")
    clean_env.delenv("WORLD_SIZE")
    clean_env.setenv("TF_CONFIG", tf_config({"chief": ["c"], "worker": ["w"]},
                                            "worker", 0))
    with pytest.raises(ValueError, match=r"TF_CONFIG \(worker 0\).*job_name"):
        ferry.Client(NOWHERE, small.spec(batch=8), timeout=1)


@pytest.mark.parametrize("kw,what", [
    ({"rank": 0}, "rank and world_size go together"),
    ({"world_size": 4}, "rank and world_size go together"),
    ({"rank": 4, "world_size": 4, "job_name": "j"}, "not below world_size"),
    ({"rank": 1, "world_size": 1}, "not below world_size"),
    ({"rank": 0, "world_size": 0}, "world_size must be"),
    ({"rank": -1, "world_size": 2, "job_name": "j"}, "rank must be"),
    ({"rank": 1, "world_size": 4}, "needs a job_name"),
    ({"rank": 1, "world_size": 4, "job_name": " "}, "needs a job_name"),
    ({"rank": 1, "world_size": 4, "job_name": "j",
      "mode": "parallel_epochs"}, "distributed_epoch"),
])
def test_bad_rank_arguments(clean_env, small, kw, what):
    with pytest.raises(ValueError, match=what):
        ferry.Client(NOWHERE, small.spec(batch=8), timeout=1, **kw)


def test_bad_rank_types(clean_env, small):
    with pytest.raises(TypeError):
        ferry.Client(NOWHERE, small.spec(batch=8), rank="0", world_size=2,
                     job_name="j")
    with pytest.raises(TypeError):
        ferry.Client(NOWHERE, small.spec(batch=8), rank=0, world_size=2.0,
                     job_name="j")


def test_world_of_one_and_overrides(clean_env, cluster, small):
    """A world of one has no ranks; explicit arguments beat the
    environment; parallel_epochs ignores the launcher."""
    clean_env.setenv("WORLD_SIZE", "1")
    clean_env.setenv("RANK", "0")
    with ferry.Client(cluster.addr, small.spec(batch=100), epochs=1,
                      timeout=TIMEOUT) as c:
        assert c.rank is None and c.world_size is None
        assert c.steps_per_epoch is None and c.dropped_per_epoch is None
        sizes = [(len(b), b.num_real) for b in c]
        assert sizes == [(100, 100)] * 10, sizes
    clean_env.setenv("WORLD_SIZE", "4")
    clean_env.setenv("RANK", "3")
    with ferry.Client(cluster.addr, small.spec(batch=100), epochs=1,
                      rank=0, world_size=1, timeout=TIMEOUT) as c:
        assert c.rank is None
        assert sum(len(b) for b in c) == len(small)
    with ferry.Client(cluster.addr, small.spec(batch=100), epochs=1,
                      mode="parallel_epochs", timeout=TIMEOUT) as c:
        assert c.rank is None
        assert sum(len(b) for b in c) == len(small)


# ---- ranked jobs ----------------------------------------------------------

@pytest.fixture(scope="module")
def ranked_data(tmp_path_factory):
    return ferrytest.Dataset(str(tmp_path_factory.mktemp("ranks")), 6,
                             RECORDS)


def expected_steps(drop, n=RECORDS):
    rnd = RANKS * BATCH
    return n // rnd if drop else -(-n // rnd)


def _read_rank(client, data):
    """Every batch of the job: {epoch: {"sizes", "real", "padded"}}."""
    epochs = collections.defaultdict(
        lambda: {"sizes": [], "real": [], "padded": [], "num_real": []})
    for b in client:
        ids = numpy.asarray(b.ids).tolist()
        e = epochs[b.epoch]
        e["sizes"].append(len(b))
        e["num_real"].append(b.num_real)
        e["real"].extend(ids[:b.num_real])
        e["padded"].extend(ids[b.num_real:])
        if b.num_real:  # the records are the files' (first and last)
            images = numpy.asarray(b.images)
            for k in (0, b.num_real - 1):
                assert images[k].tobytes() == data.images[ids[k]]
        del b
    return dict(epochs)


def run_ranked(addr, data, drop, job=None, **kw):
    """RANKS clients of one job, each read by its own thread; returns
    ({rank: epochs}, [clients' (rank, world, steps, dropped)])."""
    job = job or "ranks-" + uuid.uuid4().hex[:8]
    clients = []
    try:
        for r in range(RANKS):
            clients.append(ferry.Client(
                addr, data.spec(), job_name=job, batch_size=BATCH,
                drop_remainder=drop, epochs=EPOCHS, rank=r,
                world_size=RANKS, timeout=TIMEOUT, **kw))
        props = [(c.rank, c.world_size, c.steps_per_epoch,
                  c.dropped_per_epoch) for c in clients]
        outs = ferrytest.in_threads(
            [lambda c=c: _read_rank(c, data) for c in clients], 4 * TIMEOUT)
    finally:
        for c in clients:
            c.close()
    return dict(enumerate(outs)), props


def check_ranked(results, props, data, drop):
    s = expected_steps(drop)
    dropped = RECORDS - s * RANKS * BATCH if drop else 0
    for r, p in enumerate(props):
        assert p == (r, RANKS, s, dropped), (r, p)
    for e in range(EPOCHS):
        counts = collections.Counter()
        line = []
        for r, epochs in sorted(results.items()):
            ep = epochs.get(e)
            assert ep is not None, "rank %d: no batch of epoch %d" % (r, e)
            assert len(ep["sizes"]) == s, (r, e, len(ep["sizes"]), s)
            assert set(ep["sizes"]) == {BATCH}, (r, e, ep["sizes"])
            counts.update(ep["real"])
            line.append("rank %d: %d steps, %d real" % (
                r, len(ep["sizes"]), len(ep["real"])))
            if drop:
                assert not ep["padded"], (r, e, ep["num_real"])
            else:
                # num_real is BATCH but at the end of the epoch.
                nr = ep["num_real"]
                k = next((i for i, n in enumerate(nr) if n < BATCH), len(nr))
                assert all(n == 0 for n in nr[k + 1:]), (r, e, nr)
                assert set(ep["padded"]) <= data.ids(), (r, e)
                if ep["real"]:  # a rank pads with its own records
                    assert set(ep["padded"]) <= set(ep["real"]), (r, e)
        print("epoch %d (%s, %d steps): %s" % (
            e, "drop" if drop else "pad", s, "; ".join(line)))
        if drop:
            dup = sorted(i for i, n in counts.items() if n != 1)
            assert not dup, "epoch %d: %d ids twice: %s" % (e, len(dup),
                                                           dup[:5])
            assert set(counts) <= data.ids()
            assert len(counts) == RECORDS - dropped, (len(counts), dropped)
        else:
            ferrytest.assert_exactly_once(counts, data.ids(),
                                          "epoch %d" % e)


@pytest.mark.parametrize("drop", [False, True], ids=["pad", "drop"])
def test_four_ranks(clean_env, make_cluster, ranked_data, drop):
    cluster = make_cluster(workers=2)
    results, props = run_ranked(cluster.addr, ranked_data, drop)
    check_ranked(results, props, ranked_data, drop)


def test_four_ranks_from_env(clean_env, make_cluster, ranked_data):
    """Each thread's client takes its rank from the environment as it is
    when the client is made (here WORLD_SIZE/RANK set per client)."""
    cluster = make_cluster(workers=1)
    job = "env-" + uuid.uuid4().hex[:8]
    clients = []
    try:
        for r in range(RANKS):
            clean_env.setenv("RANK", str(r))
            clean_env.setenv("WORLD_SIZE", str(RANKS))
            c = ferry.Client(cluster.addr, ranked_data.spec(), job_name=job,
                             batch_size=BATCH, epochs=1, timeout=TIMEOUT)
            clients.append(c)
            assert (c.rank, c.world_size) == (r, RANKS)
            assert c.steps_per_epoch == expected_steps(False)
            assert "rank=%d/%d" % (r, RANKS) in repr(c), repr(c)
    finally:
        for c in clients:
            c.close()


LOCKSTEP_TIMEOUT = 5.0


def test_lockstep_ranks_share_a_split(clean_env, make_cluster, ranked_data):
    """Ranks in lockstep, as DistributedDataParallel makes them: each
    takes one batch, then waits for the others (a barrier standing in for
    the all-reduce). Here the ranks' shares (75 records) end inside the
    dataset's files (50 records each)."""
    cluster = make_cluster(workers=1)
    job = "lockstep-" + uuid.uuid4().hex[:8]
    clients = []
    barrier = threading.Barrier(RANKS, timeout=3 * LOCKSTEP_TIMEOUT)
    got = {}

    def run(r, c):
        steps = 0
        try:
            for b in c:
                del b
                steps += 1
                barrier.wait()
            got[r] = steps
        except threading.BrokenBarrierError:
            got[r] = "step %d: another rank failed" % (steps + 1)
        except ferry.TimeoutError:
            got[r] = "step %d: no batch within %.0f s" % (steps + 1,
                                                        LOCKSTEP_TIMEOUT)
            barrier.abort()
        except BaseException as e:  # noqa: B902 - reported below
            got[r] = e
            barrier.abort()

    try:
        for r in range(RANKS):
            clients.append(ferry.Client(
                cluster.addr, ranked_data.spec(), job_name=job,
                batch_size=BATCH, epochs=1, rank=r, world_size=RANKS,
                timeout=LOCKSTEP_TIMEOUT))
        ts = [threading.Thread(target=run, args=(r, c))
              for r, c in enumerate(clients)]
        for t in ts:
            t.start()
        for t in ts:
            t.join(6 * LOCKSTEP_TIMEOUT)
        assert not any(t.is_alive() for t in ts)
    finally:
        for c in clients:
            c.close()
    print(got)
    for r in range(RANKS):
        assert not isinstance(got.get(r), BaseException), got
    assert [got.get(r) for r in range(RANKS)] == \
        [expected_steps(False)] * RANKS, got


def _client_ids(msg):
    return [int(x) for x in re.findall(r"client (\d+)", msg)]


def test_rank_held_twice_and_disagreeing_ranks(clean_env, cluster,
                                               ranked_data):
    job = "twice-" + uuid.uuid4().hex[:8]
    spec = ranked_data.spec()

    def client(**kw):
        args = dict(job_name=job, batch_size=BATCH, epochs=1, rank=1,
                    world_size=RANKS, timeout=TIMEOUT)
        args.update(kw)
        return ferry.Client(cluster.addr, spec, **args)

    with client() as first:
        assert first.rank == 1
        for kw, what in (({}, "rank 1 is held by live client"),
                         ({"world_size": 2, "rank": 0}, "world_size 2"),
                         ({"batch_size": 4}, "batch 4"),
                         ({"drop_remainder": True}, "drop")):
            with pytest.raises(ferry.Error) as e:
                client(**kw).close()
            msg = str(e.value)
            print("%s: %s" % (kw, msg))
            assert e.value.code_name == "EINVAL", msg
            assert what in msg, msg
            ids = _client_ids(msg)
            # Both clients named: the holder and the one refused.
            assert first.client_id in ids, (first.client_id, msg)
            assert any(i != first.client_id for i in ids), msg
        # The rank is free again once its client left.
    with client() as again:
        assert again.rank == 1


def test_torch_dataset_len_and_num_real(clean_env, torch, make_cluster,
                                        ranked_data):
    """ferry.torch with ranks: len(ds) == len(loader) == steps_per_epoch,
    5-tuples with num_real=True; no len() without ranks."""
    from torch.utils.data import DataLoader
    import ferry.torch as ferry_torch

    cluster = make_cluster(workers=1)
    job = "torch-" + uuid.uuid4().hex[:8]
    dss = [ferry_torch.IterableDataset(
        cluster.addr, ranked_data.spec(), job_name=job, batch_size=BATCH,
        epochs=EPOCHS, rank=r, world_size=RANKS, timeout=TIMEOUT,
        num_real=True) for r in range(RANKS)]
    s = expected_steps(False)
    outs = [[] for _ in dss]

    def run(ds, out):
        try:
            loader = DataLoader(ds, batch_size=None)
            assert len(ds) == len(loader) == ds.steps_per_epoch == s
            for epoch in range(EPOCHS):
                steps, real = 0, []
                for item in loader:
                    assert len(item) == 5
                    images, labels, ids, ep, n = item
                    assert int(ep) == epoch and images.shape[0] == BATCH
                    assert isinstance(n, int) and 0 <= n <= BATCH
                    real.extend(ids[:n].tolist())
                    steps += 1
                out.append((steps, real))
        except BaseException as e:  # noqa: B902
            out.append(e)

    try:
        ts = [threading.Thread(target=run, args=(ds, o))
              for ds, o in zip(dss, outs)]
        for t in ts:
            t.start()
        for t in ts:
            t.join(4 * TIMEOUT)
        assert not any(t.is_alive() for t in ts)
    finally:
        for ds in dss:
            ds.close()
    for o in outs:
        assert not any(isinstance(x, BaseException) for x in o), o
    for e in range(EPOCHS):
        assert [o[e][0] for o in outs] == [s] * RANKS
        ferrytest.assert_exactly_once(
            collections.Counter(i for o in outs for i in o[e][1]),
            ranked_data.ids(), "epoch %d" % e)
    plain = ferry_torch.IterableDataset(cluster.addr, ranked_data.spec(),
                                        batch_size=BATCH)
    with pytest.raises(TypeError, match="without ranks"):
        len(plain)
    assert plain._client is None  # len() did not connect
