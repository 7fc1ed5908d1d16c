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
