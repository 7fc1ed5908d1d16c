"""Type stubs of ferry._ferry, the C extension behind the `ferry` package."""

from types import TracebackType
from typing import Any, Dict, Iterator, Literal, Optional, Tuple, Type, TypedDict, Union
import builtins
import os

_Path = Union[str, "os.PathLike[str]"]

FERRY_VERSION_STRING: str

class Error(Exception):
    """A libferry error: .code (negative FERRY_E*), .code_name, the C message."""
    code: int
    code_name: str

class SpecError(Error, ValueError):
    """The pipeline spec or augment text does not parse (the message names the column)."""

class RecordError(Error):
    """A bad record under on_error='fail' (the message names file and byte offset)."""

class UnreachableError(Error, ConnectionError):
    """The dispatcher did not answer within its timeout."""

class WorkerError(Error):
    """A worker failed."""

class TimeoutError(Error, builtins.TimeoutError):
    """next() got no batch within its timeout (also builtins.TimeoutError)."""

class ClosedError(Error):
    """The client is closed."""

class CancelledError(Error):
    """An operator cancelled the job (ferryctl job cancel)."""

class ForkedError(Error):
    """A forked child used its parent's client (or made one while it was
    open: gRPC cannot run there); create clients in spawned children."""

class Array:
    """A view of a batch's images, labels or ids (no copy)."""
    @property
    def shape(self) -> Tuple[int, ...]: ...
    @property
    def dtype(self) -> Literal["uint8", "float32", "float16", "bfloat16", "int64"]: ...
    @property
    def device(self) -> str: ...
    @property
    def data_ptr(self) -> int: ...
    @property
    def nbytes(self) -> int: ...
    @property
    def __array_interface__(self) -> dict[str, Any]: ...
    def __dlpack__(self, stream: Optional[int] = None) -> Any: ...
    def __dlpack_device__(self) -> Tuple[int, int]: ...
    def __len__(self) -> int: ...

class Batch:
    """A batch held from the client's ring."""
    @property
    def images(self) -> Array: ...
    @property
    def labels(self) -> Array: ...
    @property
    def ids(self) -> Array: ...
    @property
    def epoch(self) -> int: ...
    @property
    def index(self) -> int: ...
    @property
    def num_real(self) -> int:
        """The first num_real records are real (the rest pad a ranked job's
        last batches); len(batch) otherwise."""
    @property
    def released(self) -> bool: ...
    def release(self) -> None: ...
    def __len__(self) -> int: ...
    def __enter__(self) -> "Batch": ...
    def __exit__(self, et: Optional[Type[BaseException]], ev: Optional[BaseException],
                 tb: Optional[TracebackType]) -> bool: ...

class Stats(TypedDict):
    batches: int
    records: int
    bytes: int
    wait_seconds: float
    total_seconds: float
    stall_fraction: float
    batches_per_second: float
    records_per_second: float
    workers: int
    records_acked: int
    held_records_peak: int
    held: int

class MemoryStats(TypedDict):
    bytes: int
    blocks: int

class Client:
    """A trainer's connection to a Ferry cluster; an iterator of Batch.

    ferry.Client is a subclass that takes rank and world_size from the
    launcher's environment when both are None (ferry.launcher_rank())."""
    def __init__(
        self,
        dispatcher: str,
        spec: Optional[str] = None,
        *,
        dataset_id: Optional[str] = None,
        epochs: Optional[int] = 1,
        job_name: Optional[str] = None,
        mode: Literal["distributed_epoch", "parallel_epochs"] = "distributed_epoch",
        shuffle: Optional[bool] = None,
        seed: int = 0,
        on_error: Literal["fail", "skip"] = "fail",
        batch_size: Optional[int] = None,
        drop_remainder: bool = False,
        prefetch: Optional[int] = None,
        device: str = "cpu",
        dtype: Optional[Literal["uint8", "float32", "float16", "bfloat16"]] = None,
        layout: Literal["NHWC", "NCHW"] = "NHWC",
        augment: Optional[str] = None,
        augment_seed: int = 0,
        timeout: Optional[float] = None,
        tls_ca: Optional[_Path] = None,
        tls_cert: Optional[_Path] = None,
        tls_key: Optional[_Path] = None,
        token_file: Optional[_Path] = None,
        rank: Optional[int] = None,
        world_size: Optional[int] = None,
        order: Literal["arrival", "deterministic"] = "arrival",
        resume: Optional[Union[Dict[str, bytes], bytes]] = None,
        share: bool = False,
    ) -> None: ...
    def state_dict(self) -> Dict[str, bytes]: ...
    @property
    def job_id(self) -> int: ...
    @property
    def client_id(self) -> int: ...
    @property
    def closed(self) -> bool: ...
    @property
    def prefetch(self) -> int: ...
    @property
    def timeout(self) -> Optional[float]: ...
    @property
    def rank(self) -> Optional[int]:
        """This client's rank, or None without ranks (world_size <= 1)."""
    @property
    def world_size(self) -> Optional[int]:
        """The number of ranks (> 1), or None without ranks."""
    @property
    def steps_per_epoch(self) -> Optional[int]:
        """Batches every rank gets per epoch, or None without ranks."""
    @property
    def dropped_per_epoch(self) -> Optional[int]:
        """Records of an epoch no rank gets (drop_remainder), or None
        without ranks."""
    def next(self, timeout: Optional[float] = None) -> Batch: ...
    def epochs(self) -> Iterator[Iterator[Batch]]: ...
    def stats(self) -> Stats: ...
    def close(self) -> None: ...
    def __iter__(self) -> "Client": ...
    def __next__(self) -> Batch: ...
    def __enter__(self) -> "Client": ...
    def __exit__(self, et: Optional[Type[BaseException]], ev: Optional[BaseException],
                 tb: Optional[TracebackType]) -> bool: ...

def version() -> str: ...
def memory_stats() -> MemoryStats: ...
def augment_cpu(
    images: Any,
    shape: Tuple[int, int, int, int],
    augment: str,
    *,
    seed: int = 0,
    epoch: int = 0,
    index: int = 0,
    dtype: Literal["float32", "float16", "bfloat16"] = "float32",
    layout: Literal["NHWC", "NCHW"] = "NHWC",
) -> bytes: ...
