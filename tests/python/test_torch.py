"""PyTorch consumers: DataLoader over ferry.torch.IterableDataset (every
id exactly once per epoch), and zero copy (tensors share the batch's
memory, which stays held until the last tensor made from it is gone)."""
import collections
import gc

import numpy

import ferry
import ferrytest

TIMEOUT = 30.0  # seconds per next(): a hang fails, it does not stall CI


def test_dataloader_two_epochs_exactly_once(torch, cluster, medium):
    from torch.utils.data import DataLoader
    import ferry.torch as ferry_torch

    ds = ferry_torch.IterableDataset(
        dispatcher=cluster.addr, spec=medium.spec(), batch_size=64,
        epochs=2, timeout=TIMEOUT)
    loader = DataLoader(ds, batch_size=None)
    expected = medium.ids()
    try:
        for epoch in range(2):
            counts = collections.Counter()
            batches = 0
            for images, labels, ids, ep in loader:
                assert int(ep) == epoch
                assert isinstance(images, torch.Tensor)
                assert images.dtype == torch.uint8
                assert tuple(images.shape[1:]) == (medium.h, medium.w,
                                                   medium.c)
                assert labels.dtype == torch.int64 and ids.dtype == torch.int64
                n = images.shape[0]
                assert labels.shape == (n,) and ids.shape == (n,)
                assert 0 < n <= 64
                idl = ids.tolist()
                counts.update(idl)
                # Spot-check content: first record of each batch.
                assert bytes(images[0].contiguous().numpy().tobytes()) == \
                    medium.images[idl[0]]
                assert int(labels[0]) == medium.labels[idl[0]]
                batches += 1
            ferrytest.assert_exactly_once(counts, expected,
                                          "epoch %d" % epoch)
            assert batches == -(-len(medium) // 64)
    finally:
        ds.close()


def _ptr(arr):
    return arr.__array_interface__["data"][0]


def test_zero_copy_and_slot_lifetime(torch, cluster, small):
    with ferry.Client(cluster.addr, small.spec(batch=50), epochs=1,
                      timeout=TIMEOUT) as c:
        b = c.next()
        assert c.stats()["held"] == 1
        for name in ("images", "labels", "ids"):
            a = getattr(b, name)
            p = _ptr(a)
            assert p != 0
            t = torch.from_dlpack(a)
            assert t.data_ptr() == p, name
            n = numpy.from_dlpack(a)
            assert n.ctypes.data == p, name
            m = numpy.asarray(a)
            assert m.ctypes.data == p, name
            assert tuple(t.shape) == tuple(a.shape) == n.shape == m.shape
            assert numpy.array_equal(t.numpy(), n)
        del a, t, n, m  # what the loop made holds the slot too
        assert b.images.device == "cpu" and b.images.dtype == "uint8"
        assert tuple(b.images.shape) == (50, small.h, small.w, small.c)
        assert len(b) == 50 and len(b.images) == 50
        ids = numpy.asarray(b.ids).tolist()
        assert numpy.asarray(b.images).tobytes() == small.image_bytes(ids)

        # The tensor keeps the slot: drop the Batch, the slot stays held.
        t = torch.from_dlpack(b.images)
        first = t[0].clone()
        del b
        gc.collect()
        assert c.stats()["held"] == 1, "slot given back while a tensor lives"
        # Filling the ring must not overwrite the tensor's memory.
        others = [c.next() for _ in range(2)]
        assert torch.equal(t[0], first)
        del others
        gc.collect()
        assert c.stats()["held"] == 1
        ptr = t.data_ptr()
        del t
        gc.collect()
        assert c.stats()["held"] == 0, "slot not given back after the tensor"

        # A view made from the tensor holds it too.
        b = c.next()
        view = torch.from_dlpack(b.ids)[1:]
        del b
        gc.collect()
        assert c.stats()["held"] == 1
        del view
        gc.collect()
        assert c.stats()["held"] == 0
        assert ptr != 0


def test_release_gives_the_slot_back(cluster, small):
    with ferry.Client(cluster.addr, small.spec(batch=100), epochs=1,
                      timeout=TIMEOUT, prefetch=2) as c:
        seen = 0
        for _ in range(6):  # 3 x prefetch: release() must free slots
            b = c.next()
            seen += len(b)
            b.release()
            assert c.stats()["held"] == 0
        assert seen == 600
