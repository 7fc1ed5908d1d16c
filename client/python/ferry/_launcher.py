"""Ranks from a launcher's environment.

A data-parallel trainer is started by a launcher that tells each process
its rank and the world size in environment variables. :func:`launcher_rank`
reads them, in this order (the first launcher whose variables are set
wins):

1. torchrun (``python -m torch.distributed.run``): ``RANK``, ``WORLD_SIZE``
2. Horovod (``horovodrun``): ``HOROVOD_RANK``, ``HOROVOD_SIZE``
3. Open MPI (``mpirun``): ``OMPI_COMM_WORLD_RANK``, ``OMPI_COMM_WORLD_SIZE``
4. ``TF_CONFIG`` (``tf.distribute.MultiWorkerMirroredStrategy``): the
   cluster's ``"chief"`` list (optional, at most one task) and its
   ``"worker"`` list give the world, chiefs first: the chief is rank 0,
   worker ``i`` is rank ``i + len(chief)``. Other tasks (``"evaluator"``,
   ``"ps"``) train nothing and get no rank.

Pure Python, no import of the frameworks: the launchers' variables only.
"""

from __future__ import annotations

import json
import os
from typing import Mapping, NamedTuple, Optional, Tuple

__all__ = ["LauncherRank", "launcher_rank", "LAUNCHER_VARIABLES"]


class LauncherRank(NamedTuple):
    """What :func:`launcher_rank` found: a tuple ``(rank, world_size,
    source)``, ``source`` naming the variables, e.g.
    ``"RANK/WORLD_SIZE (torchrun)"``."""

    rank: int
    world_size: int
    source: str


# (rank variable, world size variable, launcher), in precedence order;
# TF_CONFIG comes after them.
_PAIRS = (
    ("RANK", "WORLD_SIZE", "torchrun"),
    ("HOROVOD_RANK", "HOROVOD_SIZE", "Horovod"),
    ("OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE", "Open MPI"),
)

LAUNCHER_VARIABLES: Tuple[str, ...] = tuple(
    v for r, w, _ in _PAIRS for v in (r, w)) + ("TF_CONFIG",)
"""Every variable :func:`launcher_rank` reads, in precedence order."""


def _int(text: str, var: str, source: str) -> int:
    try:
        return int(text.strip(), 10)
    except ValueError:
        raise ValueError(f"{source}: {var}={text!r} is not an integer") \
            from None


def _checked(rank: int, world: int, source: str) -> LauncherRank:
    if world < 1:
        raise ValueError(f"{source}: world size {world} is below 1")
    if not 0 <= rank < world:
        raise ValueError(f"{source}: rank {rank} is not in 0 .. {world - 1} "
                         f"(world size {world})")
    return LauncherRank(rank, world, source)


def _tf_config(raw: str) -> Optional[LauncherRank]:
    source = "TF_CONFIG"
    try:
        cfg = json.loads(raw)
    except ValueError as e:
        raise ValueError(f"TF_CONFIG is not JSON ({e})") from None
    if not isinstance(cfg, dict):
        raise ValueError("TF_CONFIG is not a JSON object")
    cluster = cfg.get("cluster") or {}
    task = cfg.get("task") or {}
    if not isinstance(cluster, dict) or not isinstance(task, dict):
        raise ValueError("TF_CONFIG: 'cluster' and 'task' must be objects")
    kind = task.get("type")
    if kind not in ("chief", "worker"):
        return None  # evaluator, ps, or no task: no rank
    lists = {}
    for name in ("chief", "worker"):
        tasks = cluster.get(name) or []
        if not isinstance(tasks, list):
            raise ValueError(f"TF_CONFIG: cluster['{name}'] must be a list")
        lists[name] = len(tasks)
    index = task.get("index", 0)
    if isinstance(index, bool) or not isinstance(index, (int, str)):
        raise ValueError(f"TF_CONFIG: task index {index!r} is not an "
                         f"integer")
    index = _int(str(index), "task.index", source)
    if not 0 <= index < lists[kind]:
        raise ValueError(f"TF_CONFIG: task {kind} {index} is not in the "
                         f"cluster's {lists[kind]} {kind} task(s)")
    rank = index if kind == "chief" else lists["chief"] + index
    return _checked(rank, lists["chief"] + lists["worker"],
                    f"TF_CONFIG ({kind} {index})")


def launcher_rank(environ: Optional[Mapping[str, str]] = None
                  ) -> Optional[LauncherRank]:
    """This process's rank as its launcher set it: a
    :class:`LauncherRank` ``(rank, world_size, source)``, or None when no
    launcher's variables are set (or TF_CONFIG names a task that is not a
    chief or worker).

    ``environ`` defaults to ``os.environ``. A launcher counts as set when
    either of its two variables is (TF_CONFIG: when not empty); a pair
    with one variable missing, values that are not integers, a rank
    outside ``0 .. world_size - 1`` or a malformed TF_CONFIG raise
    ValueError naming the variables. A world size of 1 is returned as it
    is: :class:`ferry.Client` reads it as "no ranks".
    """
    env = os.environ if environ is None else environ
    for rvar, wvar, who in _PAIRS:
        r = env.get(rvar, "").strip()
        w = env.get(wvar, "").strip()
        if not r and not w:
            continue
        source = f"{rvar}/{wvar} ({who})"
        if not r or not w:
            missing, present = (rvar, wvar) if not r else (wvar, rvar)
            raise ValueError(
                f"{source}: {present} is set but {missing} is not; set "
                f"both, unset both, or give ferry.Client rank= and "
                f"world_size=")
        return _checked(_int(r, rvar, source), _int(w, wvar, source),
                        source)
    raw = env.get("TF_CONFIG", "")
    if raw.strip():
        return _tf_config(raw)
    return None


def resolve(rank: Optional[int], world_size: Optional[int],
            job_name: Optional[str], mode: object
            ) -> Tuple[Optional[int], Optional[int]]:
    """ferry.Client's rank and world_size: the caller's when either is
    given (the extension checks them), else the launcher's for a
    distributed_epoch job (None, None without a launcher, for a world of
    one, and for parallel_epochs, where every client sees everything)."""
    if rank is not None or world_size is not None:
        return rank, world_size
    if mode == "parallel_epochs":
        return None, None
    found = launcher_rank()
    if found is None or found.world_size <= 1:
        return None, None
    if not (isinstance(job_name, str) and job_name.strip()):
        raise ValueError(
            f"{found.source} make this process rank {found.rank} of "
            f"{found.world_size}, and ranks share one named job: give "
            f"ferry.Client the same job_name= in every rank (or rank=0, "
            f"world_size=1 for a job of this process alone)")
    return found.rank, found.world_size
