"""One process or ``torchrun`` ranks: process-group setup from the launcher's environment, the
per-rank batch, rank-0 helpers and cross-rank reductions.

``torchrun`` sets ``RANK``, ``WORLD_SIZE``, ``LOCAL_RANK``, ``MASTER_ADDR`` and ``MASTER_PORT``;
:func:`init` joins the process group they describe (NCCL when the run's device is CUDA, gloo on
CPU) and pins each rank to GPU ``LOCAL_RANK``. Without those variables (or with
``WORLD_SIZE=1``) the run is one process and nothing is initialised, so the same code runs
under ``python -m`` and ``torchrun``. Every helper here works in both cases.
"""
import datetime
import os
from dataclasses import dataclass

import torch
import torch.distributed as dist

#: How long collectives wait for a missing rank before failing (rather than hanging forever).
TIMEOUT = datetime.timedelta(minutes=30)


class IndivisibleBatchError(ValueError):
    """The paper's global batch does not split evenly over the ranks."""


@dataclass(frozen=True)
class Context:
    """Where this process stands: ``rank`` of ``world_size``, its ``local_rank`` on the node,
    its ``device``, and whether :func:`init` created the process group (and so must destroy
    it)."""

    rank: int
    world_size: int
    local_rank: int
    device: torch.device
    owns_group: bool

    @property
    def is_main(self):
        return self.rank == 0

    @property
    def distributed(self):
        return self.world_size > 1


def _env_int(name, default):
    value = os.environ.get(name)
    if value is None or value == "":
        return default
    try:
        return int(value)
    except ValueError:
        raise ValueError(f"environment variable {name}={value!r}: expected an integer "
                         f"(as torchrun sets it)") from None


def world_size():
    """The number of ranks of this run: the initialised process group's, else torchrun's
    ``WORLD_SIZE`` (1 without it). Known before :func:`init`, so bad batch sizes fail before any
    process group is set up."""
    if dist.is_available() and dist.is_initialized():
        return dist.get_world_size()
    world = _env_int("WORLD_SIZE", 1)
    if world < 1:
        raise ValueError(f"environment variable WORLD_SIZE={world}: expected >= 1")
    return world


def init(device):
    """Join the ``torchrun`` process group if the environment describes one; the :class:`Context`.

    ``device`` is ``"cpu"``, ``"cuda"`` or ``"cuda:N"``; under torchrun with CUDA each rank uses
    ``cuda:LOCAL_RANK`` (the index in ``device`` is then ignored) and the backend is NCCL, on CPU
    gloo. A process group that is already initialised (by the caller) is used as it is.
    """
    device = torch.device(device)
    if device.type not in ("cpu", "cuda"):
        raise ValueError(f"device={str(device)!r}: expected 'cpu' or 'cuda[:N]'")
    if device.type == "cuda" and not torch.cuda.is_available():
        raise ValueError(f"device={str(device)!r}: CUDA is not available on this machine")
    if dist.is_available() and dist.is_initialized():
        rank, world = dist.get_rank(), dist.get_world_size()
        local_rank = _env_int("LOCAL_RANK", rank)
        owns = False
    else:
        world = _env_int("WORLD_SIZE", 1)
        rank = _env_int("RANK", 0)
        local_rank = _env_int("LOCAL_RANK", rank)
        if world < 1 or not 0 <= rank < world:
            raise ValueError(f"RANK={rank}, WORLD_SIZE={world}: expected 0 <= RANK < WORLD_SIZE")
        owns = False
        if world > 1:
            if not dist.is_available():
                raise RuntimeError("WORLD_SIZE > 1 but torch.distributed is not available")
            backend = "nccl" if device.type == "cuda" else "gloo"
            if device.type == "cuda":
                torch.cuda.set_device(local_rank)
            dist.init_process_group(backend, init_method="env://", rank=rank, world_size=world,
                                    timeout=TIMEOUT)
            owns = True
    if device.type == "cuda" and world > 1:
        device = torch.device("cuda", local_rank)
        torch.cuda.set_device(device)
    elif device.type == "cuda" and device.index is None:
        device = torch.device("cuda", torch.cuda.current_device())
    return Context(rank, world, local_rank, device, owns)


def teardown(ctx):
    """Destroy the process group if :func:`init` created it."""
    if ctx.owns_group and dist.is_initialized():
        dist.destroy_process_group()


def per_rank_batch(global_batch, world_size):
    """The per-rank batch: the paper's total ``global_batch`` over ``world_size`` ranks.

    Raises :class:`IndivisibleBatchError` naming both numbers when it does not divide.
    """
    if not isinstance(global_batch, int) or global_batch < 1:
        raise ValueError(f"batch_size={global_batch!r}: expected an integer >= 1")
    if global_batch % world_size:
        raise IndivisibleBatchError(
            f"batch_size={global_batch} (the global batch) is not divisible by the world size "
            f"{world_size}: each of the {world_size} ranks must take an equal share; choose a "
            f"batch that is a multiple of {world_size} or another number of processes")
    return global_batch // world_size


def active():
    """Whether a process group with more than one rank is initialised."""
    return dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1


def is_main():
    """Whether this is rank 0 (or the only process)."""
    return not (dist.is_available() and dist.is_initialized()) or dist.get_rank() == 0


def barrier():
    if active():
        dist.barrier()


def all_reduce(values, op="sum", device="cpu"):
    """``values`` (a list of numbers) reduced over the ranks (``op`` ``"sum"`` or ``"max"``),
    in float64; the values themselves in one process."""
    values = [float(v) for v in values]
    if not active():
        return values
    if dist.get_backend() == "nccl":
        device = torch.device("cuda", torch.cuda.current_device())
    tensor = torch.tensor(values, dtype=torch.float64, device=device)
    dist.all_reduce(tensor, op=dist.ReduceOp.SUM if op == "sum" else dist.ReduceOp.MAX)
    return tensor.cpu().tolist()


def all_reduce_tensor(tensor, op="sum"):
    """A new tensor: ``tensor`` reduced element-wise over the ranks (``op`` ``"sum"`` or
    ``"max"``) in its own dtype, so integer (int64) sums are exact; a copy of ``tensor`` in one
    process. The result is on ``tensor``'s device; under NCCL a CPU tensor goes through the
    current CUDA device and back."""
    if op not in ("sum", "max"):
        raise ValueError(f"op={op!r}: expected 'sum' or 'max'")
    out = tensor.detach().clone()
    if not active():
        return out
    work = out
    if dist.get_backend() == "nccl" and out.device.type != "cuda":
        work = out.to(torch.device("cuda", torch.cuda.current_device()))
    dist.all_reduce(work, op=dist.ReduceOp.SUM if op == "sum" else dist.ReduceOp.MAX)
    return work.to(tensor.device)


def all_gather_object(obj):
    """Every rank's ``obj`` in rank order (``[obj]`` in one process)."""
    if not active():
        return [obj]
    gathered = [None] * dist.get_world_size()
    dist.all_gather_object(gathered, obj)
    return gathered


def broadcast_object(obj):
    """Rank 0's ``obj`` on every rank."""
    if not active():
        return obj
    box = [obj]
    dist.broadcast_object_list(box, src=0)
    return box[0]


__all__ = ["Context", "IndivisibleBatchError", "TIMEOUT", "active", "all_gather_object",
           "all_reduce", "all_reduce_tensor", "barrier", "broadcast_object", "init", "is_main",
           "per_rank_batch", "teardown", "world_size"]
