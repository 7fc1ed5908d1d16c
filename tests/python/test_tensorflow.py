"""TensorFlow consumers, run in the TensorFlow venv (tests/interop's
setup-venv.sh) by `run.sh tensorflow`: tf.experimental.dlpack.from_dlpack
on the batch's arrays (zero copy) and ferry.tf.dataset (tf.data, copying)
give the generated files' values, every id once per epoch."""
import collections

import numpy
import pytest

import ferry
import ferrytest

tf = pytest.importorskip("tensorflow", reason="run by `run.sh tensorflow` "
                         "in the TensorFlow venv")


def test_dlpack_into_tensorflow(cluster, small):
    counts = collections.Counter()
    with ferry.Client(cluster.addr, small.spec(), batch_size=128, epochs=1,
                      timeout=30.0) as c:
        for b in c:
            images = tf.experimental.dlpack.from_dlpack(b.images.__dlpack__())
            labels = tf.experimental.dlpack.from_dlpack(b.labels.__dlpack__())
            ids = tf.experimental.dlpack.from_dlpack(b.ids.__dlpack__())
            n = len(b)
            assert images.dtype == tf.uint8 and labels.dtype == tf.int64
            assert tuple(images.shape) == (n, small.h, small.w, small.c)
            idl = ids.numpy().tolist()
            assert images.numpy().tobytes() == small.image_bytes(idl)
            assert labels.numpy().tolist() == [small.labels[i] for i in idl]
            # A TF op over the shared memory.
            s = int(tf.reduce_sum(tf.cast(images, tf.int64)))
            assert s == int(numpy.asarray(b.images, numpy.int64).sum())
            counts.update(idl)
            del images, labels, ids, b
        assert c.stats()["held"] == 0
    ferrytest.assert_exactly_once(counts, small.ids())


def _parts(elem):
    if isinstance(elem, dict):
        return elem["images"], elem["labels"], elem["ids"]
    return elem[0], elem[1], elem[2]


def test_tf_data_dataset_two_epochs(cluster, small):
    import ferry.tf
    ds = ferry.tf.dataset(dispatcher=cluster.addr, spec=small.spec(),
                          batch_size=100, epochs=2, timeout=30.0)
    assert isinstance(ds, tf.data.Dataset)
    counts = collections.Counter()
    batches = 0
    for elem in ds:
        images, labels, ids = _parts(elem)
        idl = ids.numpy().tolist()
        assert images.dtype == tf.uint8
        assert images.numpy().tobytes() == small.image_bytes(idl)
        assert labels.numpy().tolist() == [small.labels[i] for i in idl]
        counts.update(idl)
        batches += 1
    assert batches == 20
    assert set(counts.values()) == {2} and set(counts) == small.ids()


def test_tf_data_ranks_cardinality(cluster, small, monkeypatch):
    """Two ranks (TF_CONFIG: a chief and a worker, as
    MultiWorkerMirroredStrategy sets it): each dataset knows its
    cardinality, steps_per_epoch x epochs, has auto-sharding off, and
    yields exactly that many batches of batch_size; the real records
    (num_real=True: the first num_real of each) reach one rank each, once
    per epoch."""
    import json
    import threading
    import uuid
    import ferry.tf
    for v in ferry._launcher.LAUNCHER_VARIABLES:
        monkeypatch.delenv(v, raising=False)
    job = "tf-" + uuid.uuid4().hex[:8]
    cl = {"chief": ["127.0.0.1:1"], "worker": ["127.0.0.1:2"]}
    dss = []
    for kind in ("chief", "worker"):
        monkeypatch.setenv("TF_CONFIG", json.dumps(
            {"cluster": cl, "task": {"type": kind, "index": 0}}))
        dss.append(ferry.tf.dataset(cluster.addr, small.spec(),
                                    job_name=job, batch_size=64, epochs=2,
                                    timeout=30.0, num_real=True))
    steps = -(-len(small) // (2 * 64))   # padding: ceil(1000 / 128) = 8
    off = tf.data.experimental.AutoShardPolicy.OFF
    for ds in dss:
        assert int(ds.cardinality()) == 2 * steps
        assert ds.options().experimental_distribute.auto_shard_policy == off
    outs = [[], []]

    def run(ds, out):
        try:
            for images, labels, ids, epoch, n in ds:
                assert images.shape[0] == 64
                out.append((int(epoch), ids.numpy()[:int(n)].tolist()))
        except BaseException as e:  # noqa: B902
            out.append(e)

    ts = [threading.Thread(target=run, args=(ds, o))
          for ds, o in zip(dss, outs)]
    for t in ts:
        t.start()
    for t in ts:
        t.join(120)
    assert not any(t.is_alive() for t in ts)
    for o in outs:
        assert not any(isinstance(x, BaseException) for x in o), o
        assert len(o) == 2 * steps
    for e in range(2):
        counts = collections.Counter(i for o in outs for ep, ids in o
                                     if ep == e for i in ids)
        ferrytest.assert_exactly_once(counts, small.ids(), "epoch %d" % e)
