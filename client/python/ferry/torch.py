"""PyTorch: a ``torch.utils.data.IterableDataset`` over a Ferry job.

::

    from torch.utils.data import DataLoader
    import ferry.torch

    ds = ferry.torch.IterableDataset(dispatcher="127.0.0.1:5050", spec=spec,
                                     epochs=10, device="cuda:0",
                                     dtype="float16", layout="NCHW",
                                     augment="flip(horizontal) | rescale(1/255)")
    loader = DataLoader(ds, batch_size=None)   # Ferry batches already
    for epoch in range(10):
        for images, labels, ids, ep in loader:
            loss = model(images).loss(labels) ...
    ds.close()

Each ``iter(ds)`` (each ``for ... in loader``) yields the next epoch's
batches as tuples ``(images, labels, ids, epoch)`` of tensors made with
``torch.from_dlpack``: no copy, the tensors are views of the client's ring
slot, which goes back once all four are gone. ``images`` is on the GPU with
``device="cuda:N"``; labels and ids stay on the host (int64).

Data-parallel training (DistributedDataParallel): give ``job_name`` (the
same in every rank) and either ``rank=``/``world_size=`` or nothing, so
that torchrun's ``RANK``/``WORLD_SIZE`` are taken. Every rank then yields
``len(ds)`` (= ``ds.steps_per_epoch``) batches of exactly ``batch_size``
records per epoch, so ``len(loader)`` and LR schedules work. Without
``drop_remainder`` the last batches are padded with repeated records:
``num_real=True`` makes each item a 5-tuple ``(images, labels, ids, epoch,
num_real)`` whose first ``num_real`` records are real (leave the rest out
of the loss)::

    ds = ferry.torch.IterableDataset("10.0.0.1:5050", spec, job_name="run7",
                                     batch_size=64, epochs=10, num_real=True)
    for epoch in range(10):
        for images, labels, ids, ep, n in DataLoader(ds, batch_size=None):
            losses = F.cross_entropy(model(images), labels, reduction="none")
            (losses[:n].sum() / len(labels)).backward()

Use ``DataLoader(ds, batch_size=None)`` and the default ``num_workers=0``:
the preprocessing already runs on Ferry's workers, and a DataLoader worker
process would copy every batch through shared memory. With
``num_workers > 0``, each worker process creates its own client; give a
``job_name`` so they share one job (and ``mode="distributed_epoch"`` splits
the records among them), else each runs its own private job. A ranked
dataset needs ``num_workers=0``: the rank is one client's.
"""

from __future__ import annotations

import os
from typing import Any, Iterator, Optional, Tuple

import torch
from torch.utils.data import IterableDataset as _TorchIterableDataset

import ferry
from ferry import _launcher

__all__ = ["IterableDataset"]


class IterableDataset(_TorchIterableDataset):
    """A Ferry job as a PyTorch ``IterableDataset``.

    Takes the arguments of :class:`ferry.Client` (``rank``/``world_size``
    included: left out, the launcher's environment gives them), plus
    ``num_real=False``: True yields 5-tuples ``(images, labels, ids, epoch,
    num_real)`` instead of 4-tuples, ``num_real`` an int (the first
    ``num_real`` records of the batch are real, the rest padding of a
    ranked job; ``len(images)`` otherwise). The client is created lazily,
    in the process that iterates (so a DataLoader worker gets its own), and
    kept across epochs: each ``iter()`` yields one epoch, so ``for epoch in
    range(E): for batch in loader`` walks the job's epochs. Iterating again
    after the job's last epoch yields nothing.

    With ranks, ``len(ds)`` is :attr:`steps_per_epoch` (it creates the
    client if needed); without ranks ``len()`` raises TypeError, as for any
    IterableDataset without a length.

    With ``order="deterministic"`` it is a stateful dataset in the protocol
    of torchdata's ``StatefulDataLoader``: :meth:`state_dict` is the
    client's checkpoint cursor, and :meth:`load_state_dict` makes the next
    client (the next ``iter()``) resume the job there.
    """

    def __init__(self, *args: Any, num_real: bool = False,
                 **client_kwargs: Any) -> None:
        super().__init__()
        self._args = args
        self._kwargs = client_kwargs
        self._num_real = bool(num_real)
        self._client: Optional[ferry.Client] = None
        self._epochs: Optional[Iterator[Iterator[ferry.Batch]]] = None
        self._pid: Optional[int] = None

    def _ranked(self) -> bool:
        """Whether the client will have ranks (without creating it)."""
        kw = self._kwargs
        rank, world = _launcher.resolve(
            kw.get("rank"), kw.get("world_size"), kw.get("job_name"),
            kw.get("mode", "distributed_epoch"))
        return world is not None and world > 1

    @property
    def client(self) -> ferry.Client:
        """The client of this process (created on first use)."""
        if self._client is None or self._pid != os.getpid():
            if (torch.utils.data.get_worker_info() is not None
                    and self._ranked()):
                raise RuntimeError(
                    "ferry.torch.IterableDataset with ranks in a DataLoader "
                    "worker process: the rank belongs to one client, so "
                    "use DataLoader(ds, batch_size=None) with "
                    "num_workers=0 (the work already runs on Ferry's "
                    "workers)")
            # A forked DataLoader worker must not use its parent's client.
            self._client = ferry.Client(*self._args, **self._kwargs)
            self._epochs = self._client.epochs()
            self._pid = os.getpid()
        return self._client

    @property
    def steps_per_epoch(self) -> Optional[int]:
        """:attr:`ferry.Client.steps_per_epoch`: the batches every rank
        yields per epoch, or None without ranks (creates the client)."""
        return self.client.steps_per_epoch

    def __len__(self) -> int:
        if not self._ranked():
            raise TypeError(
                "len() of a ferry.torch.IterableDataset without ranks: the "
                "number of batches is not known before the epoch ends "
                "(with world_size > 1 it is steps_per_epoch)")
        steps = self.client.steps_per_epoch
        assert steps is not None
        return steps

    def __iter__(self) -> Iterator[Tuple[Any, ...]]:
        self.client  # noqa: B018 (creates the client and its epochs)
        assert self._epochs is not None
        epoch = next(self._epochs, None)
        if epoch is None:
            return
        for b in epoch:
            item: Tuple[Any, ...] = (
                torch.from_dlpack(b.images), torch.from_dlpack(b.labels),
                torch.from_dlpack(b.ids), b.epoch)
            if self._num_real:
                item += (b.num_real,)
            del b  # the tensors hold the slot; the Batch need not
            yield item
            del item

    def state_dict(self) -> dict:
        """:meth:`ferry.Client.state_dict` of this process's client (the
        cursor to resume at), or the one loaded and not used yet."""
        if self._client is None and "resume" in self._kwargs:
            return dict(self._kwargs["resume"])
        return self.client.state_dict()

    def load_state_dict(self, state: dict) -> None:
        """Resumes at the cursor `state` (from :meth:`state_dict`): the
        client this process has is closed, and the next ``iter()``
        creates one that resumes the job there."""
        self.close()
        self._kwargs = dict(self._kwargs, resume=dict(state))

    def stats(self) -> dict:
        """The client's :meth:`ferry.Client.stats`."""
        return self.client.stats()

    def close(self) -> None:
        """Closes this process's client (see :meth:`ferry.Client.close`)."""
        if self._client is not None and self._pid == os.getpid():
            self._client.close()
        self._client = None
        self._epochs = None

    def __getstate__(self) -> dict:
        # Pickled into DataLoader workers (spawn): without the client.
        state = self.__dict__.copy()
        state["_client"] = None
        state["_epochs"] = None
        state["_pid"] = None
        return state
