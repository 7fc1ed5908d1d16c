"""Client options beyond the defaults: a named job shared by two clients
(one naming the dataset by id), shuffling, epochs=None (forever), the
Array protocol details and keyword-only arguments."""
import collections
import random
import threading

import numpy
import pytest

import ferry
import ferrytest

TIMEOUT = 30.0


def test_array_protocols(cluster, small):
    with ferry.Client(cluster.addr, small.spec(batch=10), epochs=1,
                      timeout=TIMEOUT) as c:
        b = c.next()
        kdlcpu = 1
        for a, dt, shape in ((b.images, "uint8", (10, 8, 8, 3)),
                             (b.labels, "int64", (10,)),
                             (b.ids, "int64", (10,))):
            assert a.__dlpack_device__() == (kdlcpu, 0)
            assert a.device == "cpu" and a.dtype == dt
            assert tuple(a.shape) == shape and len(a) == shape[0]
            ai = a.__array_interface__
            assert tuple(ai["shape"]) == shape
            assert numpy.dtype(ai["typestr"]) == numpy.dtype(dt)
            cap = a.__dlpack__()
            assert type(cap).__name__ == "PyCapsule"
            del cap  # an unconsumed capsule gives its hold back too
        del a, b
        assert c.stats()["held"] == 0


def test_keyword_only_arguments(cluster, small):
    with pytest.raises(TypeError):
        ferry.Client(cluster.addr, small.spec(batch=10), "some-dataset-id")
    with pytest.raises(TypeError):
        ferry.Client(cluster.addr, small.spec(batch=10), no_such_option=1)


def _consume(client, out):
    try:
        ids = []
        for b in client:
            ids.extend(numpy.asarray(b.ids).tolist())
        out.append(ids)
    except BaseException as e:  # noqa: B902 - reported by the test
        out.append(e)


@pytest.fixture(scope="module")
def many(tmp_path_factory):
    # 40 files: more splits than a client holds at once (8), so a second
    # client joining the job finds splits left.
    return ferrytest.Dataset(str(tmp_path_factory.mktemp("many")), 40, 4000)


def test_named_job_shared_by_two_clients(cluster, many):
    spec = many.spec(batch=50)
    c1 = ferry.Client(cluster.addr, spec, job_name="shared", epochs=1,
                      timeout=TIMEOUT)
    try:
        jobs = [j for j in cluster.status()["jobs"] if j["name"] == "shared"]
        assert len(jobs) == 1, cluster.status()["jobs"]
        c2 = ferry.Client(cluster.addr, dataset_id=jobs[0]["dataset_id"],
                          job_name="shared", epochs=1, timeout=TIMEOUT)
        try:
            assert c1.job_id == c2.job_id == jobs[0]["id"]
            assert c1.client_id != c2.client_id
            r1, r2 = [], []
            ts = [threading.Thread(target=_consume, args=(c1, r1)),
                  threading.Thread(target=_consume, args=(c2, r2))]
            for t in ts:
                t.start()
            for t in ts:
                t.join(60)
            assert not any(t.is_alive() for t in ts)
            assert isinstance(r1[0], list), r1
            assert isinstance(r2[0], list), r2
            print("client 1: %d records, client 2: %d"
                  % (len(r1[0]), len(r2[0])))
            ferrytest.assert_exactly_once(
                collections.Counter(r1[0] + r2[0]), many.ids())
            # The second client joined while 32 of 40 splits were left.
            assert r1[0] and r2[0], "one client got the whole job"
        finally:
            c2.close()
    finally:
        c1.close()


def _epoch_ids(addr, spec, **kw):
    with ferry.Client(addr, spec, epochs=1, timeout=TIMEOUT, **kw) as c:
        return [i for b in c for i in numpy.asarray(b.ids).tolist()]


def _ascending(ids):
    """Fraction of neighbours in ascending order."""
    return sum(a < b for a, b in zip(ids, ids[1:])) / (len(ids) - 1)


def test_shuffle(cluster, small):
    seed = random.SystemRandom().randrange(1 << 32)
    print("shuffle seed %d" % seed)
    plain = _epoch_ids(cluster.addr, small.spec(batch=100), shuffle=False)
    mixed = _epoch_ids(cluster.addr, small.spec(batch=100), shuffle=True,
                       seed=seed)
    for ids in (plain, mixed):
        ferrytest.assert_exactly_once(collections.Counter(ids), small.ids())
    print("ascending neighbours: plain %.3f, shuffled %.3f"
          % (_ascending(plain), _ascending(mixed)))
    assert _ascending(plain) > 0.95
    assert _ascending(mixed) < 0.75


def test_epochs_none_runs_until_closed(cluster, small):
    c = ferry.Client(cluster.addr, small.spec(batch=250), epochs=None,
                     timeout=TIMEOUT)
    try:
        per_epoch = collections.Counter()
        for b in c:
            per_epoch[b.epoch] += len(b)
            if b.epoch == 3:
                break
        del b
        assert per_epoch[0] == per_epoch[1] == per_epoch[2] == len(small)
    finally:
        c.close()


def test_version_is_the_projects():
    import os
    import re
    with open(os.path.join(ferrytest.REPO, "CMakeLists.txt")) as f:
        m = re.search(r"project\(\s*ferry\s+VERSION\s+([0-9.]+)", f.read())
    assert m, "no project(ferry VERSION ...) in CMakeLists.txt"
    assert ferry.version() == m.group(1)
    assert ferry.__version__ == m.group(1)


def test_cuda_device_works_or_says_why(cluster, small):
    """device="cuda:0": CUDA batches on a CUDA build with a device; else
    (this CPU machine) a ferry.Error ENOTSUP before any batch."""
    try:
        c = ferry.Client(cluster.addr, small.spec(batch=10), epochs=1,
                         device="cuda:0", dtype="float32", timeout=TIMEOUT)
    except ferry.Error as e:
        print("device cuda:0: %s" % e)
        assert e.code_name == "ENOTSUP", (e.code_name, str(e))
        assert "CUDA" in str(e) or "cuda" in str(e)
        return
    with c:
        b = c.next()
        assert b.images.device == "cuda:0"
        assert b.images.__dlpack_device__() == (2, 0)  # kDLCUDA, device 0
        assert not hasattr(b.images, "__array_interface__")


def test_parallel_epochs_every_worker_makes_everything(make_cluster, small):
    cl = make_cluster(workers=2)
    counts = collections.Counter()
    with ferry.Client(cl.addr, small.spec(batch=100), epochs=1,
                      mode="parallel_epochs", timeout=TIMEOUT) as c:
        for b in c:
            counts.update(numpy.asarray(b.ids).tolist())
    assert set(counts) == small.ids()
    assert set(counts.values()) == {2}, collections.Counter(counts.values())
    with pytest.raises(ValueError):
        ferry.Client(cl.addr, small.spec(batch=100), mode="parallel")


def _epoch_images(client):
    out = {}
    for b in client:
        ids = numpy.asarray(b.ids).tolist()
        images = numpy.asarray(b.images)
        for i, rid in enumerate(ids):
            assert rid not in out, "record %d twice" % rid
            out[rid] = images[i].tobytes()
    return out


def test_share_two_trainers_get_everything(cluster, small):
    """Two trainers of their own jobs with share=True over one spec and
    seed: each gets every record once, the same bytes, and the status
    says both jobs share; share must be a bool."""
    spec = small.spec(batch=100)
    with pytest.raises(TypeError):
        ferry.Client(cluster.addr, spec, share=1)
    clients = [ferry.Client(cluster.addr, spec, epochs=1, shuffle=True,
                            seed=3, share=True, timeout=TIMEOUT)
               for _ in range(2)]
    try:
        jobs = {j["id"]: j for j in cluster.status()["jobs"]}
        for c in clients:
            assert jobs[c.job_id]["share"] is True, jobs[c.job_id]
        got = [{}, {}]

        def run(i):
            got[i] = _epoch_images(clients[i])

        ts = [threading.Thread(target=run, args=(i,)) for i in range(2)]
        for t in ts:
            t.start()
        for t in ts:
            t.join(60)
        assert not any(t.is_alive() for t in ts)
        for g in got:
            assert set(g) == small.ids()
            for rid, img in g.items():
                assert img == small.images[rid]
    finally:
        for c in clients:
            c.close()
