"""Memory stays flat over 10,000 batches: after a warm-up, neither
tracemalloc's traced size (Python objects: batches, arrays, capsules,
tensors) nor ferry.memory_stats() (libferry's live allocations) grows
beyond a small bound."""
import gc
import tracemalloc

import numpy

import ferry

BATCHES = 10_000
WARMUP = 1_000
SAMPLE_EVERY = 500
# Bounds on growth from the warm-up to the end. One leaked Batch with its
# three Arrays is several hundred bytes of Python objects, so a leak per
# batch would be MBs over 9,000 batches; libferry allocates per chunk and
# per heartbeat, a leak there is also thousands of allocations.
PY_BOUND = 64 << 10
LIB_BOUND = 256 << 10
LIB_BLOCKS_BOUND = 256


def test_memory_flat_over_10000_batches(as_tensor, cluster, tiny):
    # tiny: 4,000 records of 4x4x1; batch 2 -> 2,000 batches per epoch.
    epochs = BATCHES // (len(tiny) // 2)
    assert epochs * len(tiny) // 2 == BATCHES
    py, lib, blocks = [], [], []
    n = 0
    with ferry.Client(cluster.addr, tiny.spec(), batch_size=2,
                      epochs=epochs, timeout=30.0) as c:
        try:
            for b in c:
                # The consumer path of a trainer: tensors and arrays made
                # from every batch, then dropped.
                t = as_tensor(b.images)
                lab = numpy.from_dlpack(b.labels)
                ids = numpy.asarray(b.ids)
                assert t.shape[0] == lab.shape[0] == ids.shape[0] == 2
                del t, lab, ids, b
                n += 1
                if n == WARMUP:
                    gc.collect()
                    tracemalloc.start()
                if n >= WARMUP and n % SAMPLE_EVERY == 0:
                    gc.collect()
                    py.append(tracemalloc.get_traced_memory()[0])
                    m = ferry.memory_stats()
                    lib.append(m["bytes"])
                    blocks.append(m["blocks"])
        finally:
            tracemalloc.stop()
        assert c.stats()["held"] == 0
    assert n == BATCHES
    print("tracemalloc bytes at each sample: %s" % py)
    print("libferry bytes at each sample: %s" % lib)
    print("libferry blocks at each sample: %s" % blocks)
    assert lib[0] > 0 and blocks[0] > 0  # the counters count something
    assert py[-1] - py[0] <= PY_BOUND, "Python memory grew %d bytes" % (
        py[-1] - py[0])
    assert max(lib) - lib[0] <= LIB_BOUND, "libferry grew %d bytes" % (
        max(lib) - lib[0])
    assert max(blocks) - blocks[0] <= LIB_BLOCKS_BOUND
