"""NumPy consumers: numpy.from_dlpack and numpy.asarray see the batch's
images, labels and ids; every value equals the generated files' (ferryctl
gen is deterministic and decode(raw) copies the bytes as they are)."""
import collections

import numpy

import ferry
import ferrytest

TIMEOUT = 30.0


def test_numpy_values_equal_the_files(cluster, small):
    bs = 96  # 1,000 records: 10 full batches and one of 40
    counts = collections.Counter()
    sizes = []
    with ferry.Client(cluster.addr, small.spec(), batch_size=bs, epochs=1,
                      timeout=TIMEOUT) as c:
        assert isinstance(c.job_id, int) and isinstance(c.client_id, int)
        for b in c:
            assert b.epoch == 0
            imgs = numpy.from_dlpack(b.images)
            imgs2 = numpy.asarray(b.images)
            labels = numpy.from_dlpack(b.labels)
            ids = numpy.from_dlpack(b.ids)
            assert imgs.dtype == numpy.uint8 and imgs2.dtype == numpy.uint8
            assert labels.dtype == numpy.int64 and ids.dtype == numpy.int64
            n = len(b)
            assert imgs.shape == (n, small.h, small.w, small.c)
            assert labels.shape == (n,) and ids.shape == (n,)
            assert numpy.array_equal(imgs, imgs2)
            assert numpy.array_equal(numpy.asarray(b.labels), labels)
            idl = ids.tolist()
            assert imgs.tobytes() == small.image_bytes(idl)
            assert labels.tolist() == [small.labels[i] for i in idl]
            counts.update(idl)
            sizes.append(n)
            del imgs, imgs2, labels, ids, b
        st = c.stats()
    ferrytest.assert_exactly_once(counts, small.ids())
    assert sorted(sizes, reverse=True) == [bs] * 10 + [40]
    assert st["batches"] == 11 and st["records"] == 1000
    for k in ("bytes", "wait_seconds", "total_seconds", "stall_fraction",
              "batches_per_second", "records_per_second", "workers",
              "records_acked", "held_records_peak", "records_placed_ahead",
              "held"):
        assert k in st, k
    assert 0.0 <= st["stall_fraction"] <= 1.0


def test_epochs_iterators_and_drop_remainder(cluster, small):
    """client.epochs() yields one iterator per epoch, each ending at its
    epoch's end; drop_remainder drops each epoch's partial batch."""
    with ferry.Client(cluster.addr, small.spec(), batch_size=300, epochs=2,
                      drop_remainder=True, timeout=TIMEOUT) as c:
        per_epoch = []
        for e, it in enumerate(c.epochs()):
            ids = []
            for b in it:
                assert b.epoch == e and len(b) == 300
                ids.extend(numpy.asarray(b.ids).tolist())
            per_epoch.append(ids)
        assert len(per_epoch) == 2
        for ids in per_epoch:
            assert len(ids) == 900 == len(set(ids))
            assert set(ids) <= small.ids()
        try:
            c.next()
        except StopIteration:
            pass
        else:
            raise AssertionError("next() after the job's end gave a batch")
