"""Running one fit over many processes with torch.distributed: each rank reduces its own rows, sums are all-reduced.

Launch with ``torchrun`` (or any env:// rendezvous). gloo is used on CPU, NCCL on CUDA. Every
rank reaches the same T because every decision is taken on all-reduced sums; only rank 0
prints and writes.
"""

from __future__ import annotations

import os

import torch

from ..errors import TempcalError, param


def active() -> bool:
    """True inside an initialised process group of more than one process."""
    import torch.distributed as dist

    return dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1


def rank() -> int:
    import torch.distributed as dist

    return dist.get_rank() if active() else 0


def world_size() -> int:
    import torch.distributed as dist

    return dist.get_world_size() if active() else 1


#: Whether this module started the process group (and so destroys it in :func:`shutdown`).
_started = False


def init_from_environment(device: str) -> str:
    """Join the process group of torchrun's environment (if any; gloo on CPU, NCCL on CUDA); returns the device to
    use, :func:`rank_device`'s choice, made current first so that NCCL binds this rank to it."""
    global _started
    if int(os.environ.get("WORLD_SIZE", "1")) <= 1:
        return device
    import torch.distributed as dist

    chosen = rank_device(device)
    if chosen.type == "cuda":
        torch.cuda.set_device(chosen)
    if not dist.is_initialized():
        dist.init_process_group(backend="nccl" if chosen.type == "cuda" else "gloo")
        _started = True
    return str(chosen)


def rank_device(device: str) -> torch.device:
    """The device of this torchrun process for ``--device device``.

    ``cpu`` (and ``auto`` without CUDA) is the CPU. An explicit ``cuda:N`` is used as given, unless every
    process on this node would share it (all see the same GPUs: no ``CUDA_VISIBLE_DEVICES``). ``cuda``
    and ``auto`` take GPU ``LOCAL_RANK``, or the only GPU a process sees when each sees one of its own.
    """
    from .data import resolve_device

    chosen = resolve_device(device)
    if chosen.type != "cuda":
        return chosen
    local, count = int(os.environ.get("LOCAL_RANK", "0")), torch.cuda.device_count()
    per_node = int(os.environ.get("LOCAL_WORLD_SIZE", "1"))
    if chosen.index is not None:
        if per_node > 1 and count > 1 and "CUDA_VISIBLE_DEVICES" not in os.environ:
            raise TempcalError(f"{param('device')} {device}: the {per_node} processes torchrun started on this node "
                               f"would all use {chosen}; use {param('device')} cuda (process LOCAL_RANK takes "
                               "cuda:LOCAL_RANK) or give each process its GPU with CUDA_VISIBLE_DEVICES")
        return chosen
    if local < count:
        return torch.device("cuda", local)
    if count == 1:
        return torch.device("cuda", 0)  # one GPU per process (CUDA_VISIBLE_DEVICES set per rank)
    raise TempcalError(f"{param('device')} {device}: this process has LOCAL_RANK {local} but sees {count} CUDA "
                       f"devices; start at most {count} processes per node, or give each one GPU with "
                       "CUDA_VISIBLE_DEVICES")


def shutdown() -> None:
    """Destroy the process group :func:`init_from_environment` started (a no-op otherwise)."""
    global _started
    if _started:
        import torch.distributed as dist

        if dist.is_initialized():
            dist.destroy_process_group()
        _started = False


def all_reduce(tensor: torch.Tensor, op: str = "sum") -> torch.Tensor:
    """In place across ranks (a no-op in a single process)."""
    if active():
        import torch.distributed as dist

        dist.all_reduce(tensor, op={"sum": dist.ReduceOp.SUM, "min": dist.ReduceOp.MIN,
                                    "max": dist.ReduceOp.MAX}[op])
    return tensor


def all_gather_1d(tensor: torch.Tensor) -> torch.Tensor:
    """Concatenate every rank's 1-D tensor in rank order (tensors may differ in length)."""
    return all_gather_rows(tensor)


def all_gather_rows(tensor: torch.Tensor) -> torch.Tensor:
    """Concatenate every rank's tensor along its first dimension (which may differ, and be 0) in rank order: the
    one-process tensor of every row."""
    if not active():
        return tensor
    import torch.distributed as dist

    size = torch.tensor([tensor.shape[0]], dtype=torch.int64, device=tensor.device)
    sizes = [torch.zeros_like(size) for _ in range(dist.get_world_size())]
    dist.all_gather(sizes, size)
    counts = [int(s.item()) for s in sizes]
    if max(counts) == 0:
        return tensor
    padded = torch.zeros((max(counts), *tensor.shape[1:]), dtype=tensor.dtype, device=tensor.device)
    padded[: tensor.shape[0]] = tensor
    parts = [torch.zeros_like(padded) for _ in counts]
    dist.all_gather(parts, padded)
    return torch.cat([p[:count] for p, count in zip(parts, counts, strict=True)])


def share(count: int) -> tuple[int, int]:
    """This rank's contiguous share ``[start, stop)`` of ``count`` rows."""
    r, w = rank(), world_size()
    return count * r // w, count * (r + 1) // w
