"""Data-parallel capture under torchrun (SPEC §19): rank and world size from the environment, batches shared out by
rank, the reducers' sums combined once at the end, rank 0 alone writes and prints.

The contract, the same code path with a world size of 1:
- `join_process_group(device)` creates the default process group under torchrun (`WORLD_SIZE` > 1) if none exists:
  NCCL when the model is on a CUDA device, gloo otherwise. A group the caller created is used as it is.
- `mine(index)`: batch `index` (0-based, in the order every rank builds the same way) belongs to rank
  `index % world`; every rank tokenises every text (cheap) and runs the model on its own batches only.
- `merge_reducers(reducers)`: once, after the last batch, every reducer's running sums are added over the ranks
  (`all_reduce(SUM)`), so that `result()` gives the same answer on every rank. A reducer says what to add in
  `rank_sums` (attribute names: float64 / int64 tensors, numpy arrays or Python numbers; an attribute that is still
  None on a rank that saw no batch is taken as zeros of the other ranks' shape); a reducer whose state is not a
  sum (a top-K list, a sample) also defines `merge_ranks()`, called after the sums are added, and lists what it
  combines there (and arrays that are settings) in `rank_kept`. A reducer with neither `rank_sums` nor
  `merge_ranks`, or holding an array listed in neither tuple, is refused before any batch (`check_mergeable`).
- `is_main_process()`: rank 0 (or a plain run): the CLI prints only there; once a capture ran data-parallel,
  `posprobe.formats.writing` writes only there too (`skips_writes`).

N ranks give the same sums as one process up to float64 summation order; integer counts are equal.

The one run loop (`capture.loop.drive`) keeps this contract for every command that runs a model on text (text
batches, `context`'s windows, `needle`'s prompts): `parallel = join_process_group(device)`; skip item k where `not
mine(k)` (progress: `done_by_all(k, total)` after item k); after the loop, `merge_reducers(reducers)`. A reducer
with one result per item fills a zero array at the items this rank ran and adds it over the ranks in its
`merge_ranks` (every item was run by exactly one rank). Commands write and print only where `is_main_process()`.
"""

from __future__ import annotations

import atexit
import os
import sys
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from posprobe.errors import PosprobeError

if TYPE_CHECKING:
    import torch

_MAX_DIMS = 8  # dimensions of a lazily allocated sum that `_agree_on_shape` can describe
_DATA_PARALLEL = [False]  # set once a capture ran data-parallel in this process
_TIMEOUT_S = 1800  # a rank waiting this long for the others gives up (torchrun normally stops it much sooner)


def env_rank_and_world() -> tuple[int, int]:
    """(RANK, WORLD_SIZE) as torchrun sets them; (0, 1) in a plain run. Reads only the environment (no torch)."""
    try:
        return int(os.environ.get("RANK", "0")), int(os.environ.get("WORLD_SIZE", "1"))
    except ValueError:
        return 0, 1


def rank_and_world() -> tuple[int, int]:
    """(rank, world size) of the default process group when one is initialised, else from the environment."""
    dist = sys.modules.get("torch.distributed")
    if dist is not None and dist.is_available() and dist.is_initialized():
        return dist.get_rank(), dist.get_world_size()
    return env_rank_and_world()


def is_main_process() -> bool:
    """True on rank 0 and in a plain run: the one process that writes files and prints results."""
    return rank_and_world()[0] == 0


def skips_writes() -> bool:
    """True on a rank other than 0 once a capture ran data-parallel (`join_process_group`): `posprobe.formats.writing`
    writes nothing there. Other torchrun users (finetune) keep their own rules."""
    return _DATA_PARALLEL[0] and rank_and_world()[0] != 0


def local_cuda_device() -> str:
    """'cuda:LOCAL_RANK' under torchrun (one GPU per rank), 'cuda' otherwise."""
    local = os.environ.get("LOCAL_RANK")
    return f"cuda:{int(local)}" if local is not None and local.isdigit() else "cuda"


def join_process_group(device: Any = "cpu") -> bool:
    """Whether this run is data-parallel (world size > 1); under torchrun, create the default process group first
    when none exists (NCCL for a CUDA `device`, gloo otherwise; destroyed when the process exits)."""
    if env_rank_and_world()[1] <= 1 and "torch.distributed" not in sys.modules:
        return False
    import datetime

    import torch
    import torch.distributed as dist

    if not dist.is_available():
        return False
    if not dist.is_initialized():
        if env_rank_and_world()[1] <= 1:
            return False
        cuda = torch.device(device).type == "cuda"
        if cuda:
            torch.cuda.set_device(torch.device(device))
        dist.init_process_group("nccl" if cuda else "gloo", timeout=datetime.timedelta(seconds=_TIMEOUT_S))
        atexit.register(_leave_process_group)
    _DATA_PARALLEL[0] = _DATA_PARALLEL[0] or dist.get_world_size() > 1
    return dist.get_world_size() > 1


def _leave_process_group() -> None:
    import torch.distributed as dist

    if dist.is_initialized():
        dist.destroy_process_group()


def mine(index: int) -> bool:
    """Whether batch `index` is this rank's (every `world`-th batch, starting at the rank)."""
    rank, world = rank_and_world()
    return index % world == rank


def done_by_all(index: int, total: int) -> int:
    """How many of `total` items (batches, windows, prompts) the ranks have finished, all together, when this rank
    finishes item `index` (0-based): the whole round of `world` items that ran beside it, at most `total`; index + 1
    in a plain run. For a progress count over every rank's items, shown on rank 0."""
    world = rank_and_world()[1]
    return min(total, (index // world + 1) * world)


def check_mergeable(reducers: Sequence[Any]) -> None:
    """Refuse, before any batch, a reducer that cannot be combined over ranks: one with neither `rank_sums` nor
    `merge_ranks`, or holding an array listed neither in `rank_sums` nor in `rank_kept` (arrays `merge_ranks`
    combines, or settings the same on every rank): a sum added to a reducer and forgotten here would otherwise
    hold one rank's texts only."""
    import numpy as np
    import torch

    for reducer in reducers:
        name = type(reducer).__name__
        if getattr(reducer, "rank_sums", None) is None and not hasattr(reducer, "merge_ranks"):
            raise PosprobeError(
                f"{name} cannot be combined over torchrun ranks (it declares no rank_sums)",
                "run it in one process (without torchrun)",
            )
        listed = set(getattr(reducer, "rank_sums", None) or ()) | set(getattr(reducer, "rank_kept", ()))
        for attribute, value in vars(reducer).items():
            if isinstance(value, torch.Tensor | np.ndarray) and attribute not in listed:
                raise PosprobeError(
                    f"{name}.{attribute} is not combined over torchrun ranks (not in rank_sums or rank_kept)",
                    "run it in one process (without torchrun); this is a bug in posprobe, please report it",
                )


def _peer_lost(function):
    """`function`, a collective, with a failure of the process group (a rank that stopped on its own error closes
    its connections: gloo and NCCL raise a RuntimeError in the ranks waiting for it) said in one line, not as a bug
    of posprobe: the rank that stopped printed why, unless a signal killed it (then torchrun's summary says so)."""
    import functools

    @functools.wraps(function)
    def wrapped(*args, **kwargs):
        try:
            return function(*args, **kwargs)
        except RuntimeError as err:
            raise PosprobeError(
                "another torchrun rank stopped before the ranks' results were combined (its error line says why; "
                "a rank killed by a signal, or out of memory, prints none: torchrun's summary names its exit)",
                "fix what it reports and run again; nothing was written",
            ) from err

    return wrapped


@_peer_lost
def reduce_counts(values: Sequence[int], op: str = "sum") -> list[int]:
    """Integers added (or maximised, `op` 'max') over the ranks, in one call."""
    import torch
    import torch.distributed as dist

    tensor = torch.tensor([int(v) for v in values], dtype=torch.int64, device=_collective_device())
    dist.all_reduce(tensor, op=dist.ReduceOp.MAX if op == "max" else dist.ReduceOp.SUM)
    return [int(v) for v in tensor.tolist()]


def merge_reducers(reducers: Sequence[Any]) -> None:
    """Add every reducer's `rank_sums` over the ranks in place, then call its `merge_ranks()` if it has one."""
    for reducer in reducers:
        for name in getattr(reducer, "rank_sums", None) or ():
            setattr(reducer, name, all_reduce_sum(getattr(reducer, name)))
        if hasattr(reducer, "merge_ranks"):
            reducer.merge_ranks()


@_peer_lost
def all_reduce_sum(value: Any) -> Any:
    """`value` (a torch tensor, numpy array, Python int / float, or None where this rank saw no batch) added over
    the ranks; returned in the kind it came in (None on every rank stays None; None here becomes the others' kind)."""
    import numpy as np
    import torch
    import torch.distributed as dist

    kind = "none" if value is None else "numpy" if isinstance(value, np.ndarray) else type(value).__name__
    if kind not in ("none", "numpy", "Tensor", "int", "float"):
        raise TypeError(f"cannot add a {kind} over ranks")
    as_tensor = value if kind == "Tensor" else None if value is None else torch.as_tensor(np.asarray(value))
    shape, dtype = _agree_on_shape(as_tensor)
    if shape is None:
        return None
    device = _collective_device()
    if as_tensor is None:
        as_tensor = torch.zeros(shape, dtype=dtype)
        kind = "Tensor" if dtype in (torch.float64, torch.int64) else kind
    if tuple(as_tensor.shape) != shape:
        raise PosprobeError(
            f"the ranks' sums differ in shape ({tuple(as_tensor.shape)} here, {shape} elsewhere)",
            "every rank must run the same model with the same settings",
        )
    work = as_tensor.to(device)
    dist.all_reduce(work)
    if kind == "Tensor":
        if work.data_ptr() != as_tensor.data_ptr():
            as_tensor.copy_(work)
        return as_tensor
    array = work.cpu().numpy()
    if kind == "numpy":
        return array
    return int(array) if kind == "int" else float(array)


_DTYPES = ("float64", "int64", "float32", "int32", "bool")


def _agree_on_shape(tensor: torch.Tensor | None) -> tuple[tuple[int, ...] | None, torch.dtype | None]:
    """The shape and dtype of a sum, agreed by the ranks (a rank with None takes the others'): (None, None) when
    no rank has it."""
    import torch
    import torch.distributed as dist

    info = torch.full((2 + _MAX_DIMS,), -1, dtype=torch.int64)
    if tensor is not None:
        if tensor.dim() > _MAX_DIMS or str(tensor.dtype).removeprefix("torch.") not in _DTYPES:
            raise TypeError(f"cannot add a {tensor.dtype} tensor of {tensor.dim()} dimensions over ranks")
        info[0] = tensor.dim()
        info[1] = _DTYPES.index(str(tensor.dtype).removeprefix("torch."))
        info[2 : 2 + tensor.dim()] = torch.tensor(tensor.shape, dtype=torch.int64)
    info = info.to(_collective_device())
    dist.all_reduce(info, op=dist.ReduceOp.MAX)
    info = info.cpu().tolist()
    if info[0] < 0:
        return None, None
    return tuple(info[2 : 2 + info[0]]), getattr(torch, _DTYPES[info[1]])


@_peer_lost
def all_gather(tensor: torch.Tensor) -> list[torch.Tensor]:
    """Every rank's `tensor` (same shape and dtype on every rank), in rank order, on this tensor's device."""
    import torch
    import torch.distributed as dist

    work = tensor.to(_collective_device())
    parts = [torch.empty_like(work) for _ in range(dist.get_world_size())]
    dist.all_gather(parts, work)
    return [part.to(tensor.device) for part in parts]


def all_gather_or_zeros(tensor: torch.Tensor | None) -> list[torch.Tensor] | None:
    """`all_gather` of a lazily allocated tensor: a rank where it is None sends zeros of the others' shape and
    dtype; None when it is None on every rank. The parts are on the CPU where this rank has None."""
    import torch

    shape, dtype = _agree_on_shape(tensor)
    if shape is None:
        return None
    return all_gather(torch.zeros(shape, dtype=dtype) if tensor is None else tensor)


def _collective_device():
    """Where collective tensors must live: the current CUDA device for NCCL, the CPU for gloo."""
    import torch
    import torch.distributed as dist

    if dist.get_backend() == "nccl":
        return torch.device("cuda", torch.cuda.current_device())
    return torch.device("cpu")
