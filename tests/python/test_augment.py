"""Augmented output (float32, float16, bfloat16; NCHW and NHWC) is bit for
bit ferry.augment_cpu (the C CPU twin) applied to the batch's raw images
(read from the generated files) with the same seed, epoch and index."""
import random

import numpy
import pytest

import ferry
from ferrytest import torch_or_skip

AUGMENT = "flip(horizontal) | rotate(0.2) | zoom(0.15) | rescale(1/255)"
SEED = random.SystemRandom().randrange(1 << 32)


def raw_bytes(arr):
    """The batch output's bytes, through DLPack (bfloat16: torch, viewed as
    int16, since NumPy has no bfloat16)."""
    if arr.dtype == "bfloat16":
        torch = torch_or_skip()
        t = torch.from_dlpack(arr)
        assert t.dtype == torch.bfloat16
        return t.view(torch.int16).numpy().tobytes()
    return numpy.from_dlpack(arr).tobytes()


@pytest.mark.parametrize("dtype", ["float32", "float16", "bfloat16"])
@pytest.mark.parametrize("layout", ["NCHW", "NHWC"])
def test_augmented_equals_cpu_twin(cluster, small, dtype, layout):
    if dtype == "bfloat16":
        torch_or_skip()
    print("augment seed %d (dtype %s, layout %s)" % (SEED, dtype, layout))
    itemsize = {"float32": 4, "float16": 2, "bfloat16": 2}[dtype]
    n_img = small.h * small.w * small.c
    checked = 0
    with ferry.Client(cluster.addr, small.spec(), batch_size=128, epochs=2,
                      augment=AUGMENT, augment_seed=SEED, dtype=dtype,
                      layout=layout, timeout=30.0) as c:
        for b in c:
            n = len(b)
            a = b.images
            assert a.dtype == dtype
            want_shape = ((n, small.c, small.h, small.w) if layout == "NCHW"
                          else (n, small.h, small.w, small.c))
            assert tuple(a.shape) == want_shape
            got = raw_bytes(a)
            assert len(got) == n * n_img * itemsize
            ids = numpy.asarray(b.ids).tolist()
            want = ferry.augment_cpu(
                small.image_bytes(ids), (n, small.h, small.w, small.c),
                AUGMENT, seed=SEED, epoch=b.epoch, index=b.index,
                dtype=dtype, layout=layout)
            assert isinstance(want, bytes) and len(want) == len(got)
            if got != want:
                i = next(k for k in range(len(got)) if got[k] != want[k])
                raise AssertionError(
                    "batch %d (epoch %d): output differs from the CPU twin "
                    "at byte %d (image %d); seed %d"
                    % (b.index, b.epoch, i, i // (n_img * itemsize), SEED))
            # The seed matters: another seed gives other bytes (the test
            # would pass vacuously if it were ignored).
            if checked == 0:
                other = ferry.augment_cpu(
                    small.image_bytes(ids), (n, small.h, small.w, small.c),
                    AUGMENT, seed=SEED + 1, epoch=b.epoch, index=b.index,
                    dtype=dtype, layout=layout)
                assert other != want
            checked += 1
            del a, b
    assert checked == 2 * 8  # 1,000 records / 128 = 8 batches, 2 epochs


def test_float_without_augment_only_converts(cluster, small):
    with ferry.Client(cluster.addr, small.spec(batch=100), epochs=1,
                      dtype="float32", layout="NCHW", timeout=30.0) as c:
        b = c.next()
        got = numpy.from_dlpack(b.images)
        assert got.dtype == numpy.float32
        ids = numpy.asarray(b.ids).tolist()
        raw = numpy.frombuffer(small.image_bytes(ids), numpy.uint8).reshape(
            100, small.h, small.w, small.c)
        assert numpy.array_equal(got, raw.transpose(0, 3, 1, 2)
                                 .astype(numpy.float32))


def test_bad_dtype_arguments(cluster, small):
    spec = small.spec(batch=10)
    with pytest.raises(ValueError):
        ferry.Client(cluster.addr, spec, augment=AUGMENT, dtype="uint8")
    with pytest.raises(ValueError):
        ferry.Client(cluster.addr, spec, layout="NCHW", dtype="uint8")
    with pytest.raises(ValueError):
        ferry.Client(cluster.addr, spec, dtype="float64")
    with pytest.raises(ValueError):
        ferry.Client(cluster.addr, spec, layout="CHWN")
    with pytest.raises(TypeError):
        ferry.Client(cluster.addr, spec, epochs="two")
