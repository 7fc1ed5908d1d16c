"""TensorFlow: a ``tf.data.Dataset`` over a Ferry job.

Two ways in:

Zero copy, in an eager loop (DLPack)::

    import tensorflow as tf
    for b in client:
        images = tf.experimental.dlpack.from_dlpack(b.images.__dlpack__())
        labels = tf.experimental.dlpack.from_dlpack(b.labels.__dlpack__())
        train_step(images, labels)

``tf.data`` (for ``model.fit`` and graph code; copies each batch once into
a TensorFlow tensor, through ``tf.data.Dataset.from_generator``)::

    import ferry.tf
    ds = ferry.tf.dataset(dispatcher="127.0.0.1:5050", spec=spec, epochs=5)
    model.fit(ds.map(lambda x, y, ids, epoch: (x, y)), epochs=1)

Data-parallel (``MultiWorkerMirroredStrategy``): give ``job_name`` and
either ``rank=``/``world_size=`` or nothing, so that ``TF_CONFIG`` (or
another launcher's variables) gives them. The dataset then has a known
cardinality, ``steps_per_epoch x epochs`` (Keras knows its steps), and
tf.data's auto-sharding is turned off: Ferry already gives each rank its
own records.

TensorFlow is imported when :func:`dataset` is called, not with this module.
"""

from __future__ import annotations

from typing import Any

import ferry
from ferry import _launcher

__all__ = ["dataset"]

_TF_DTYPES = {"uint8": "uint8", "float32": "float32", "float16": "float16",
              "bfloat16": "bfloat16"}


def _images_dtype(kwargs: dict) -> str:
    dtype = kwargs.get("dtype")
    if dtype is not None:
        return str(dtype)
    converted = (bool((kwargs.get("augment") or "").strip())
                 or kwargs.get("layout", "NHWC") == "NCHW"
                 or str(kwargs.get("device", "cpu")).startswith("cuda"))
    return "float32" if converted else "uint8"


def dataset(*args: Any, num_real: bool = False,
            **client_kwargs: Any) -> "tf.data.Dataset":  # noqa: F821
    """A ``tf.data.Dataset`` of ``(images, labels, ids, epoch)`` tuples.

    Takes the arguments of :class:`ferry.Client`. Every time the dataset is
    iterated, a new client is created, which runs the job's ``epochs``
    (one client per iteration: give a ``job_name`` to resume a shared job).
    Elements are copies (``tf.data`` owns its tensors), made on the host:
    images uint8 NHWC, or the client's dtype/layout; labels and ids int64
    of shape (n,); epoch an int64 scalar. ``num_real=True`` appends
    ``num_real``, an int64 scalar: the batch's first ``num_real`` records
    are real, the rest padding of a ranked job. For zero copy use the
    DLPack loop in this module's documentation.

    With ranks (``world_size > 1``, given or from the launcher's
    environment) the first client is created here, so that its
    ``steps_per_epoch`` is known: the dataset asserts the cardinality
    ``steps_per_epoch x epochs`` (infinite for ``epochs=None``; unknown
    for ``epochs=0``, the spec's count), its first iteration uses that
    client, and auto-sharding is off (``AutoShardPolicy.OFF``).
    """
    import numpy as np
    import tensorflow as tf

    dtype = _images_dtype(client_kwargs)
    if dtype not in _TF_DTYPES:
        raise ValueError(f"dtype must be one of {sorted(_TF_DTYPES)}, "
                         f"got {dtype!r}")
    tf_dtype = getattr(tf, _TF_DTYPES[dtype])
    with_real = bool(num_real)

    kwargs = dict(client_kwargs)
    rank, world = _launcher.resolve(
        kwargs.pop("rank", None), kwargs.pop("world_size", None),
        kwargs.get("job_name"), kwargs.get("mode", "distributed_epoch"))
    kwargs["rank"], kwargs["world_size"] = rank, world
    first = []
    steps = None
    if world is not None and world > 1:
        first.append(ferry.Client(*args, **kwargs))
        steps = first[0].steps_per_epoch

    def generate():
        client = first.pop() if first else ferry.Client(*args, **kwargs)
        with client:
            for b in client:
                # Copies: tf.data keeps its elements beyond the batch.
                a = b.images
                if a.device == "cpu" and a.dtype != "bfloat16":
                    images = np.array(np.asarray(a))
                else:
                    t = tf.experimental.dlpack.from_dlpack(a.__dlpack__())
                    with tf.device("CPU:0"):
                        if a.device == "cpu":  # bfloat16: a new buffer
                            images = tf.cast(tf.cast(t, tf.float32), t.dtype)
                        else:                  # device to host copy
                            images = tf.identity(t)
                    del t
                del a
                labels = np.array(np.asarray(b.labels))
                ids = np.array(np.asarray(b.ids))
                epoch = np.int64(b.epoch)
                real = np.int64(b.num_real)
                del b
                if with_real:
                    yield images, labels, ids, epoch, real
                else:
                    yield images, labels, ids, epoch

    signature = (
        tf.TensorSpec(shape=(None, None, None, None), dtype=tf_dtype),
        tf.TensorSpec(shape=(None,), dtype=tf.int64),
        tf.TensorSpec(shape=(None,), dtype=tf.int64),
        tf.TensorSpec(shape=(), dtype=tf.int64),
    )
    if with_real:
        signature += (tf.TensorSpec(shape=(), dtype=tf.int64),)
    ds = tf.data.Dataset.from_generator(generate, output_signature=signature)
    if steps is None:
        return ds
    epochs = client_kwargs.get("epochs", 1)
    if epochs is None:
        ds = ds.apply(tf.data.experimental.assert_cardinality(
            tf.data.INFINITE_CARDINALITY))
    elif isinstance(epochs, int) and epochs > 0:
        ds = ds.apply(tf.data.experimental.assert_cardinality(
            steps * epochs))
    options = tf.data.Options()
    options.experimental_distribute.auto_shard_policy = (
        tf.data.experimental.AutoShardPolicy.OFF)
    return ds.with_options(options)
