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

Data-parallel trainers (PyTorch DDP, Horovod, MultiWorkerMirroredStrategy)
make one client per rank: ``ferry.Client(..., job_name=..., rank=R,
world_size=W)``, or rank and world size from the launcher's environment
(:func:`launcher_rank`). Every rank then gets ``client.steps_per_epoch``
batches of exactly ``batch_size`` records per epoch (``batch.num_real`` of
them real under padding); docs/PYTHON.md, "Data-parallel training".

Submodules: :mod:`ferry.torch` (an ``IterableDataset`` for ``DataLoader``)
and :mod:`ferry.tf` (a ``tf.data.Dataset``).
"""

from typing import Any as _Any, Optional as _Optional

from ferry import _ferry
from ferry._ferry import (
    Array,
    Batch,
    ClosedError,
    CancelledError,
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

from ferry._launcher import LauncherRank, launcher_rank
from ferry import _launcher


class Client(_ferry.Client):
    __doc__ = _ferry.Client.__doc__ + """

rank and world_size left None: taken from the launcher's environment
(ferry.launcher_rank(): torchrun's RANK/WORLD_SIZE, then Horovod's
HOROVOD_RANK/HOROVOD_SIZE, Open MPI's OMPI_COMM_WORLD_RANK/SIZE, then
TF_CONFIG) for a distributed_epoch job; a world of one has no ranks.
Launcher ranks without a job_name raise ValueError naming the variables.
"""
    __slots__ = ()

    def __init__(self, dispatcher: str, spec: _Optional[str] = None, *,
                 rank: _Optional[int] = None,
                 world_size: _Optional[int] = None, **kwargs: _Any) -> None:
        rank, world_size = _launcher.resolve(
            rank, world_size, kwargs.get("job_name"),
            kwargs.get("mode", "distributed_epoch"))
        super().__init__(dispatcher, spec, rank=rank, world_size=world_size,
                         **kwargs)


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
    "LauncherRank",
    "RecordError",
    "SpecError",
    "TimeoutError",
    "UnreachableError",
    "WorkerError",
    "augment_cpu",
    "launcher_rank",
    "memory_stats",
    "version",
    "__version__",
]
