"""Deterministic order: ferry.Client(order="deterministic").

Batch s of a rank holds the records [s x B, (s + 1) x B) of the rank's
share of the epoch's order, so the batches' SHA-256 digests (images and
record ids) are a function of the files, the spec, the seed, the epoch, B,
W and the rank alone. A reference run writes every batch's digest per
rank; the same job must give the same sequence with another number of
workers, another prefetch depth, and when a random worker is SIGKILLed or
the dispatcher is SIGKILLed and restarted at a random step (seeded,
printed: FERRY_PY_SEED replays one)."""
import collections
import hashlib
import os
import random
import subprocess
import time
import uuid

import numpy
import pytest

import ferry
import ferrytest

TIMEOUT = 30.0
BATCH = 32
EPOCHS = 2
RECORDS = 3000  # 6 files of 500: a split each


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    return ferrytest.Dataset(str(tmp_path_factory.mktemp("order")), 6,
                             RECORDS)


def seed_of_run():
    seed = int(os.environ.get("FERRY_PY_SEED", time.time_ns() % 2**32))
    print("seed %d (FERRY_PY_SEED=%d replays it)" % (seed, seed))
    return seed


def _read(client, hook=None, n=None):
    """Every batch (the next n when n is given): (epoch, size, num_real,
    sha256 of images and ids), and the ids, in the order the trainer got
    them."""
    got, ids = [], []
    # Not enumerate(): its cached tuple would keep the last Batch, and its
    # slot, alive (prefetch 1 runs here).
    for b in client:
        k = len(got)
        images = numpy.asarray(b.images)
        bids = numpy.asarray(b.ids)
        got.append((b.epoch, len(b), b.num_real, hashlib.sha256(
            images.tobytes() + bids.tobytes()).hexdigest()))
        ids.append(bids[:b.num_real].tolist())
        del b, images, bids
        if hook is not None:
            hook(k)
        if n is not None and len(got) >= n:
            break
    return got, ids


def run(cluster, data, ranks, *, order="deterministic", shuffle=True,
        fault_at=None, fault=None, faults=(), **kw):
    """`ranks` clients of one job (threads); returns {rank: (digests,
    ids)}. fault() runs once, in rank 0's thread, after its batch
    fault_at; so does each (step, fn) of `faults`."""
    job = "order-" + uuid.uuid4().hex[:8]
    clients = []
    fired = []
    todo = dict(faults)
    if fault is not None:
        todo[fault_at] = fault

    def hook(k):
        if k in todo:
            fired.append("after batch %d of rank 0: %s" % (k, todo.pop(k)()))

    try:
        for r in range(ranks):
            clients.append(ferry.Client(
                cluster.addr, data.spec(), job_name=job, batch_size=BATCH,
                epochs=EPOCHS, shuffle=shuffle, seed=11, order=order,
                timeout=TIMEOUT, **({"rank": r, "world_size": ranks}
                                    if ranks > 1 else {}), **kw))
        outs = ferrytest.in_threads(
            [lambda c=c, r=r: _read(c, hook if r == 0 and todo else None)
             for r, c in enumerate(clients)], 4 * TIMEOUT)
    finally:
        for c in clients:
            c.close()
    assert not todo, "faults that did not run: %s" % sorted(todo)
    for f in fired:
        print("fault %s" % f)
    return dict(enumerate(outs))


def check_once(result, data):
    """Every record once per epoch across the ranks."""
    for e in range(EPOCHS):
        counts = collections.Counter()
        for digests, ids in result.values():
            for (ep, _, _, _), b in zip(digests, ids):
                if ep == e:
                    counts.update(b)
        ferrytest.assert_exactly_once(counts, data.ids(), "epoch %d" % e)


def same(ref, got, what):
    for r in ref:
        a, b = ref[r][0], got[r][0]
        first = next((k for k, (x, y) in enumerate(zip(a, b)) if x != y),
                     None)
        assert a == b, "%s: rank %d differs from the reference at batch " \
            "%s of %d/%d" % (what, r, first, len(a), len(b))


def test_same_batches_as_workers_come_and_go(make_cluster, data):
    """Point 5 (d): the worker count goes 3 -> 1 -> 4 during the run (two
    workers SIGKILLed at a random step, three started at a later one);
    W = 2 ranks get the reference's batches."""
    seed = seed_of_run()
    rng = random.Random(seed)
    ref = run(make_cluster(workers=2), data, 2)
    steps = len(ref[0][0])
    cl = make_cluster(workers=3)
    a = rng.randrange(1, steps // 2)
    b = rng.randrange(a + 1, steps - 1)

    def down():
        cl.kill_worker(0)
        cl.kill_worker(1)
        return "workers 0 and 1 SIGKILLed: 1 left"

    def up():
        for _ in range(3):
            cl.add_worker()
        return "3 workers started: 4"

    got = run(cl, data, 2, faults=[(a, down), (b, up)])
    same(ref, got, "3 -> 1 -> 4 workers")


def test_one_trainer_reads_the_epoch_order(make_cluster, data, monkeypatch):
    """W = 1 without shuffle: the files in order, record by record, and a
    short last batch; with shuffle the same batches whatever the workers,
    the prefetch depth and the transport."""
    cl = make_cluster(workers=2)
    plain = run(cl, data, 1, shuffle=False)[0]
    flat = [i for b in plain[1] for i in b]
    assert flat == sorted(data.ids()) * EPOCHS
    sizes = [d[1] for d in plain[0]]
    per_epoch = -(-RECORDS // BATCH)
    assert sizes == ([BATCH] * (per_epoch - 1) + [RECORDS % BATCH]) * EPOCHS
    ref = run(cl, data, 1)
    check_once(ref, data)
    # Shuffled: not the files' order, and the second epoch another one.
    ids0 = [i for (d, b) in zip(*ref[0]) if d[0] == 0 for i in b]
    ids1 = [i for (d, b) in zip(*ref[0]) if d[0] == 1 for i in b]
    assert ids0 != sorted(ids0) and ids0 != ids1
    same(ref, run(cl, data, 1, prefetch=1), "prefetch 1")
    one = make_cluster(workers=1)
    same(ref, run(one, data, 1, prefetch=6), "one worker, prefetch 6")
    for transport in ("grpc", "ucx"):
        # libferry's transport when the client gives none (auto: UCX where
        # both ends have it, as the runs above).
        monkeypatch.setenv("FERRY_TRANSPORT", transport)
        same(ref, run(cl, data, 1), transport)


@pytest.mark.parametrize("kind", ferrytest.FAULTS)
def test_ranks_same_batches_under_a_fault(make_cluster, data, kind):
    """W = 3 ranks (a rank boundary crosses splits): the digests of a
    reference run, again with a random fault at a random step."""
    seed = seed_of_run()
    rng = random.Random(seed)
    ref_cl = make_cluster(workers=2)
    ref = run(ref_cl, data, 3)
    check_once(ref, data)
    steps = len(ref[0][0])
    assert all(len(ref[r][0]) == steps for r in ref)
    cl = make_cluster(workers=3)
    got = run(cl, data, 3, fault_at=rng.randrange(1, steps - 1),
              fault=lambda: ferrytest.inject(cl, rng, kind))
    print("\n".join(ferrytest.fault_effects(cl)) or "no split restarted")
    same(ref, got, kind)


# ---- resume from a checkpoint cursor ---------------------------------------

def test_resume_from_a_cursor_gives_the_same_batches(make_cluster, data):
    """W = 3 ranks take c batches, save their cursors (all equal), go on
    for d more and leave; ranks started with the cursor deliver exactly
    the reference's batches from c on, in a random epoch and step."""
    seed = seed_of_run()
    rng = random.Random(seed)
    cl = make_cluster(workers=2)
    ref = run(cl, data, 3)
    steps = len(ref[0][0])
    c = rng.randrange(1, steps - 1)
    d = rng.randrange(0, steps - c)
    print("checkpoint after %d of %d batches, %d more before the crash"
          % (c, steps, d))
    job = "resume-" + uuid.uuid4().hex[:8]
    kw = dict(job_name=job, batch_size=BATCH, epochs=EPOCHS, shuffle=True,
              seed=11, order="deterministic", timeout=TIMEOUT, world_size=3)
    clients = [ferry.Client(cl.addr, data.spec(), rank=r, **kw)
               for r in range(3)]

    def rank(cli):
        got = _read(cli, n=c)[0]
        cursor = cli.state_dict()
        if d:
            got += _read(cli, n=d)[0]
        return got, cursor

    try:
        done = ferrytest.in_threads([lambda cli=cli: rank(cli)
                                     for cli in clients], 4 * TIMEOUT)
    finally:
        for cli in clients:
            cli.close()
    got = [x[0] for x in done]
    cursors = [x[1] for x in done]
    assert all(x == cursors[0] for x in cursors), "ranks' cursors differ"
    assert len(cursors[0]["cursor"]) <= 4096
    # Any rank's cursor restores the job: rank r resumes with rank
    # (r + 1) % 3's.
    resumed = [ferry.Client(cl.addr, data.spec(), rank=r,
                            resume=cursors[(r + 1) % 3], **kw)
               for r in range(3)]
    try:
        tails = [x[0] for x in ferrytest.in_threads(
            [lambda cli=cli: _read(cli) for cli in resumed], 4 * TIMEOUT)]
    finally:
        for cli in resumed:
            cli.close()
    for r in range(3):
        assert got[r][:c] + tails[r] == ref[r][0], (
            "rank %d: the resumed run differs from the reference (%d + %d "
            "batches against %d)" % (r, c, len(tails[r]), len(ref[r][0])))


def _records(client, n=None):
    """The trainer's real records, batch by batch: [(epoch, [(id, sha256 of
    the image)])], the next n batches when n is given."""
    out = []
    for b in client:
        images = numpy.asarray(b.images)
        ids = numpy.asarray(b.ids)
        out.append((b.epoch, [(int(ids[i]),
                               hashlib.sha256(images[i].tobytes()).hexdigest())
                              for i in range(b.num_real)]))
        del b, images, ids
        if n is not None and len(out) >= n:
            break
    return out


def _concat(stage, epoch):
    """A stage's records of `epoch`: its ranks' in rank order, each
    rank's in the order it got them."""
    return [rec for batches in stage for (e, recs) in batches if e == epoch
            for rec in recs]


@pytest.mark.parametrize("worlds", [(4, 2), (8, 4), (4, 8), (4, 2, 3)],
                         ids=["4-to-2", "8-to-4", "4-to-8", "4-to-2-to-3"])
def test_elastic_resume_continues_the_global_order(make_cluster, data,
                                                   worlds):
    """Points 4 and 5 (e): a cursor of W ranks resumed with another W. Each
    stage's ranks read a random number of steps of epoch 0, save their
    cursors (all equal) and leave; the next stage resumes with another
    world size; the last reads to the end. The epoch's global order (any
    W's ranks' records in rank order: the shares are contiguous) is a
    reference run's: each stage's records are in that order, the last
    stage's are exactly what is left of it, in order, each rank with the
    same number of steps; no record comes twice, none is missing; every
    record's bytes are the reference's; epoch 1 is whole."""
    seed = seed_of_run()
    rng = random.Random(seed)
    cl = make_cluster(workers=2)
    kw = dict(batch_size=BATCH, epochs=EPOCHS, shuffle=True, seed=11,
              order="deterministic", timeout=TIMEOUT)

    def stage(job, w, resume, n):
        clients = [ferry.Client(cl.addr, data.spec(), job_name=job, rank=r,
                                world_size=w, resume=resume, **kw)
                   for r in range(w)]
        try:
            steps = [c.steps_per_epoch for c in clients]

            def rank(c):
                got = _records(c, n)
                return got, c.state_dict() if n is not None else None
            outs = ferrytest.in_threads(
                [lambda c=c: rank(c) for c in clients], 4 * TIMEOUT)
        finally:
            for c in clients:
                c.close()
        cursors = [o[1] for o in outs]
        if n is not None:
            assert all(x == cursors[0] for x in cursors), "cursors differ"
            assert len(cursors[0]["cursor"]) <= 4096
        assert len(set(steps)) == 1, "ranks disagree on steps: %s" % steps
        return [o[0] for o in outs], cursors[0], steps[0]

    ref = stage("elastic-ref-" + uuid.uuid4().hex[:8], worlds[0], None,
                None)[0]
    order = {e: _concat(ref, e) for e in range(EPOCHS)}
    sha = {(e, i): h for e in order for (i, h) in order[e]}
    for e in order:
        ferrytest.assert_exactly_once(
            collections.Counter(i for i, _ in order[e]), data.ids(),
            "reference epoch %d" % e)
    pos = {e: {i: k for k, (i, _) in enumerate(order[e])} for e in order}

    job = "elastic-" + uuid.uuid4().hex[:8]
    cursor, taken, stages = None, set(), []
    for k, w in enumerate(worlds):
        last = k == len(worlds) - 1
        left = RECORDS - len(taken)
        want = -(-left // (w * BATCH))  # pad: ceil
        # A stage that is not the last reads at most half of what is left,
        # so that every later one still has steps of epoch 0 to read.
        n = None if last else rng.randint(1, max(1, want // 2))
        got, cursor, steps = stage(job, w, cursor, n)
        print("stage %d: %d ranks, %d steps of what is left of epoch 0 "
              "(%d records), %s" % (k, w, steps, left,
                                    "to the end" if last else
                                    "%d read" % n))
        assert steps == want, "stage %d: %d steps, want %d" % (k, steps,
                                                               want)
        recs = _concat(got, 0)
        ids = [i for i, _ in recs]
        at = [pos[0][i] for i in ids]
        assert at == sorted(at), "stage %d: out of the epoch's order" % k
        assert not taken & set(ids), "stage %d: records again" % k
        taken |= set(ids)
        for r, batches in enumerate(got):
            ep0 = [b for b in batches if b[0] == 0]
            assert len(ep0) == (steps if last else n), (
                "stage %d rank %d: %d batches of epoch 0" % (k, r, len(ep0)))
        for e in range(EPOCHS):
            for i, h in _concat(got, e):
                assert h == sha[(e, i)], "epoch %d record %d: other bytes" % (
                    e, i)
        stages.append(ids)
    last_ids = stages[-1]
    earlier = set(i for ids in stages[:-1] for i in ids)
    assert last_ids == [i for i, _ in order[0] if i not in earlier], \
        "the last stage is not what was left of epoch 0, in order"
    assert len(taken) == RECORDS and taken == set(data.ids())
    assert [i for i, _ in _concat(got, 1)] == [i for i, _ in order[1]], \
        "epoch 1 is not the global order"


def test_refused_cursors_say_what_differs(cluster, data):
    kw = dict(batch_size=BATCH, epochs=EPOCHS, shuffle=True, seed=11,
              order="deterministic", timeout=TIMEOUT)
    with ferry.Client(cluster.addr, data.spec(), **kw) as c:
        next(iter(c))
        good = c.state_dict()
        with pytest.raises(ferry.Error, match="order deterministic"):
            ferry.Client(cluster.addr, data.spec(), batch_size=BATCH,
                         timeout=TIMEOUT, resume=good)
    other = data.spec().replace("decode(raw", "decode( raw") + " | blur(3, 1)"
    with pytest.raises(ferry.Error, match="cursor is of dataset"):
        ferry.Client(cluster.addr, other, resume=good, **kw)
    with pytest.raises(ferry.Error, match="batch 32, pad; this client "
                       "has batch 16"):
        ferry.Client(cluster.addr, data.spec(), job_name="w2", rank=0,
                     world_size=2, resume=good, **dict(kw, batch_size=16))
    with pytest.raises(ferry.Error, match="another shuffle seed"):
        ferry.Client(cluster.addr, data.spec(), resume=good,
                     **dict(kw, seed=12))
    with pytest.raises(ferry.Error, match="not a Ferry cursor"):
        ferry.Client(cluster.addr, data.spec(), resume=b"garbage", **kw)
    with pytest.raises(ferry.Error, match="malformed"):
        ferry.Client(cluster.addr, data.spec(),
                     resume=good["cursor"][:-3] + b"\xff\xff\xff", **kw)
    with pytest.raises(TypeError, match="state_dict"):
        ferry.Client(cluster.addr, data.spec(), resume=42, **kw)
    with ferry.Client(cluster.addr, data.spec(), batch_size=BATCH,
                      timeout=TIMEOUT) as c:
        with pytest.raises(ferry.Error, match="order deterministic"):
            c.state_dict()


def _fields(buf):
    """A protobuf message's fields: [(number, wire type, value)]."""
    out, pos = [], 0
    while pos < len(buf):
        key, pos = ferrytest._varint(buf, pos)
        if key & 7 == 0:
            v, pos = ferrytest._varint(buf, pos)
        else:
            n, pos = ferrytest._varint(buf, pos)
            v, pos = buf[pos:pos + n], pos + n
        out.append((key >> 3, key & 7, v))
    return out


def _encode_varint(n):
    out = b""
    while True:
        b, n = n & 0x7F, n >> 7
        out += bytes([b | (0x80 if n else 0)])
        if not n:
            return out


def cursor_at(state, step):
    """state_dict()'s cursor moved to another step of its epoch (the
    format: "FERRYCUR", then ferry.v1.Cursor; field 6 is the step)."""
    raw = state["cursor"]
    assert raw[:8] == b"FERRYCUR"
    out = b""
    for num, wt, v in _fields(raw[8:]):
        if num == 6:
            continue
        out += _encode_varint(num << 3 | wt)
        out += _encode_varint(v) if wt == 0 else _encode_varint(len(v)) + v
    out += _encode_varint(6 << 3) + _encode_varint(step)
    return {"cursor": b"FERRYCUR" + out}


def test_resume_seeks_in_a_million_records(make_cluster, tmp_path):
    """Point 3: a resume at a random step of an epoch of 1,000,000
    records reads from there (the splits before it are never leased): its
    first batch, the reference run's batch at that step, within 2 s."""
    seed = seed_of_run()
    rng = random.Random(seed)
    out = str(tmp_path / "million")
    subprocess.run([ferrytest.FERRYCTL, "gen", "--out", out, "--shards",
                    "8", "--records", "1000000", "--size", "1x1",
                    "--channels", "1"], check=True, capture_output=True,
                   timeout=120)
    spec = 'tfrecord("%s/*.tfrecord") | decode(raw, 1, 1, 1)' % out
    cl = make_cluster(workers=2)
    kw = dict(batch_size=256, epochs=1, shuffle=True, seed=3,
              order="deterministic", timeout=TIMEOUT, prefetch=8)
    t0 = time.monotonic()
    ref, at = [], []
    with ferry.Client(cl.addr, spec, **kw) as c:
        for b in c:
            at.append(time.monotonic() - t0)
            if not ref:
                first = at[0]
                state = c.state_dict()
            ref.append(numpy.asarray(b.ids).copy())
            del b
    whole = time.monotonic() - t0
    steps = len(ref)
    assert steps == -(-1000000 // 256)
    print("reference: %d batches in %.2f s, the first after %.3f s "
          "(the dataset's header scan included)" % (steps, whole, first))
    for _ in range(3):
        s = rng.randrange(1, steps)
        t0 = time.monotonic()
        with ferry.Client(cl.addr, spec, resume=cursor_at(state, s),
                          **kw) as c:
            b = next(iter(c))
            took = time.monotonic() - t0
            ids = numpy.asarray(b.ids).copy()
            del b
        print("resume at step %d of %d (record %d): first batch after "
              "%.3f s (a replay from the epoch's start: %.3f s)"
              % (s, steps, s * 256, took, at[s]))
        assert numpy.array_equal(ids, ref[s]), "not the reference's batch"
        assert took < 2.0, "the first batch took %.2f s" % took
