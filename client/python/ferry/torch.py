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

Use ``DataLoader(ds, batch_size=None)`` and the default ``num_workers=0``:
the preprocessing already runs on Ferry's workers, and a DataLoader worker
process would copy every batch through shared memory. With
``num_workers > 0``, each worker process creates its own client; give a
``job_name`` so they share one job (and ``mode="distributed_epoch"`` splits
the records among them), else each runs its own private job.
"""

from __future__ import annotations

import os
from typing import Any, Iterator, Optional, Tuple

import torch
from torch.utils.data import IterableDataset as _TorchIterableDataset

import ferry

__all__ = ["IterableDataset"]


class IterableDataset(_TorchIterableDataset):
    """A Ferry job as a PyTorch ``IterableDataset``.

    Takes the arguments of :class:`ferry.Client`. The client is created
    lazily, in the process that iterates (so a DataLoader worker gets its
    own), and kept across epochs: each ``iter()`` yields one epoch, so
    ``for epoch in range(E): for batch in loader`` walks the job's epochs.
    Iterating again after the job's last epoch yields nothing.
    """

    def __init__(self, *args: Any, **client_kwargs: Any) -> None:
        super().__init__()
        self._args = args
        self._kwargs = client_kwargs
        self._client: Optional[ferry.Client] = None
        self._epochs: Optional[Iterator[Iterator[ferry.Batch]]] = None
        self._pid: Optional[int] = None

    @property
    def client(self) -> ferry.Client:
        """The client of this process (created on first use)."""
        if self._client is None or self._pid != os.getpid():
            # A forked DataLoader worker must not use its parent's client.
            self._client = ferry.Client(*self._args, **self._kwargs)
            self._epochs = self._client.epochs()
            self._pid = os.getpid()
        return self._client

    def __iter__(self) -> Iterator[Tuple[torch.Tensor, torch.Tensor,
                                         torch.Tensor, int]]:
        self.client  # noqa: B018 (creates the client and its epochs)
        assert self._epochs is not None
        epoch = next(self._epochs, None)
        if epoch is None:
            return
        for b in epoch:
            item = (torch.from_dlpack(b.images), torch.from_dlpack(b.labels),
                    torch.from_dlpack(b.ids), b.epoch)
            del b  # the tensors hold the slot; the Batch need not
            yield item
            del item

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
