"""Ferry for Python trainers.

Ferry is a remote preprocessing data service: a dispatcher and workers read,
decode and transform records; a trainer's :class:`Client` streams the
finished batches into a ring of ``prefetch`` slots and hands them out without
a copy. Each :class:`Batch` exposes ``.images``, ``.labels`` and ``.ids`` as
:class:`Array` objects that PyTorch, NumPy, TensorFlow (and any DLPack
consumer) can wrap in place::

    import ferry, torch

    spec = ('tfrecord("/data/train-*.tfrecord") | decode(raw, 32, 32, 3) '
            '| batch(256)')
    with ferry.Client("127.0.0.1:5050", spec, epochs=2) as client:
        for batch in client:
            x = torch.from_dlpack(batch.images)   # uint8 NHWC, no copy
            y = torch.from_dlpack(batch.labels)   # int64
            train_step(x, y)                       # drop x, y, batch after
        print(client.stats()["stall_fraction"])

A batch's ring slot goes back to the client when the Batch and every Array,
DLPack capsule and tensor made from it are gone; holding more than
``prefetch`` batches makes ``next()`` raise :class:`Error`. See
docs/PYTHON.md for the lifetime, thread and GPU rules.

Submodules: :mod:`ferry.torch` (an ``IterableDataset`` for ``DataLoader``)
and :mod:`ferry.tf` (a ``tf.data.Dataset``).
"""

from ferry._ferry import (
    Array,
    Batch,
    ClosedError,
    CancelledError,
    Client,
    Error,
    ForkedError,
    RecordError,
    SpecError,
    TimeoutError,
    UnreachableError,
    WorkerError,
    augment_cpu,
    memory_stats,
    version,
)

__version__: str = version()
"""The version of the libferry this package ships (``ferry.version()``)."""

__all__ = [
    "Array",
    "Batch",
    "Client",
    "ClosedError",
    "CancelledError",
    "Error",
    "ForkedError",
    "RecordError",
    "SpecError",
    "TimeoutError",
    "UnreachableError",
    "WorkerError",
    "augment_cpu",
    "memory_stats",
    "version",
    "__version__",
]
