"""torchrun set-up: ranks, devices, backend (NCCL on CUDA, gloo on CPU) and the few collectives we use.

A plain ``python -m fastrl.train`` runs as a world of one with no process group.
"""
from __future__ import annotations

import hashlib
import os
from dataclasses import dataclass
from datetime import timedelta

import torch
import torch.distributed as dist


@dataclass(frozen=True)
class DistInfo:
    rank: int = 0
    world_size: int = 1
    local_rank: int = 0

    @property
    def is_main(self) -> bool:
        return self.rank == 0

    @property
    def enabled(self) -> bool:
        return self.world_size > 1


def resolve_device(name: str, local_rank: int = 0) -> torch.device:
    if name == "auto":
        name = "cuda" if torch.cuda.is_available() else "cpu"
    if name == "cuda":
        name = f"cuda:{local_rank}"
    device = torch.device(name)
    if device.type == "cuda" and not torch.cuda.is_available():
        from fastrl.config import UserError
        raise UserError(f"device={name!r} was asked for but CUDA is not available; use --device cpu")
    return device


def setup(device_name: str) -> tuple[DistInfo, torch.device]:
    """Read torchrun's RANK/WORLD_SIZE/LOCAL_RANK, pick the device, init the process group if needed."""
    info = DistInfo(int(os.environ.get("RANK", 0)), int(os.environ.get("WORLD_SIZE", 1)),
                    int(os.environ.get("LOCAL_RANK", 0)))
    device = resolve_device(device_name, info.local_rank)
    if info.enabled and not dist.is_initialized():
        if device.type == "cuda":
            torch.cuda.set_device(device)
        backend = "nccl" if device.type == "cuda" else "gloo"
        if os.environ.get("TORCHELASTIC_USE_AGENT_STORE") == "True":
            # Key this attempt's rendezvous by torchrun's restart count: after a --max-restarts restart a
            # fast rank could otherwise read a dead rank's address left in the agent's store.
            attempt = os.environ.get("TORCHELASTIC_RESTART_COUNT", "0")
            base = dist.TCPStore(os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"]), info.world_size,
                                 is_master=False, timeout=timedelta(minutes=10))
            store = dist.PrefixStore(f"/fastrl/attempt_{attempt}", base)
            dist.init_process_group(backend, store=store, rank=info.rank, world_size=info.world_size)
        else:
            dist.init_process_group(backend)
    return info, device


def cleanup(finished: bool = False) -> None:
    """Destroy the process group. ``finished``: the run ended normally on every rank, so the ranks first meet at a
    barrier and tear gloo down together (a rank that destroyed its group and exited while rank 0 still wrote its
    summary and plot was seen to abort in C++ teardown); after an error no barrier, which could wait forever."""
    if dist.is_initialized():
        if finished:
            dist.barrier()
        dist.destroy_process_group()


def all_reduce_(tensor: torch.Tensor) -> None:
    """Sum ``tensor`` over the ranks, in place (nothing without a process group)."""
    if dist.is_initialized():
        dist.all_reduce(tensor)


def broadcast_module_(module: torch.nn.Module) -> None:
    """Make every rank start from rank 0's parameters and buffers."""
    if dist.is_initialized():
        for tensor in list(module.parameters()) + list(module.buffers()):
            dist.broadcast(tensor.data, 0)


def rank_mean():
    """A function ``tensor -> its mean over the ranks``, the same bits on every rank: one all-reduce (sum, then
    divided by the world size) as a functional collective, which ``torch.compile`` traces into the graph that calls
    it (checked with gloo on CPU, eager and compiled: tests/test_distributed.py)."""
    from torch.distributed import _functional_collectives as funcol  # imported by torchrun runs only
    group, world_size = dist.group.WORLD, dist.get_world_size()

    def mean(tensor: torch.Tensor) -> torch.Tensor:
        return funcol.all_reduce(tensor, "sum", group) / world_size
    return mean


def broadcast_object(obj):
    """Rank 0's picklable ``obj`` on every rank (identity without a process group)."""
    if not dist.is_initialized():
        return obj
    holder = [obj]
    dist.broadcast_object_list(holder, 0)
    return holder[0]


def gather_objects(obj) -> list:
    """Every rank's ``obj``, in rank order, on every rank."""
    if not dist.is_initialized():
        return [obj]
    out = [None] * dist.get_world_size()
    dist.all_gather_object(out, obj)
    return out


def parameter_hash(module: torch.nn.Module) -> str:
    """SHA-256 of all parameters' bytes: equal across ranks iff the parameters are bitwise identical."""
    digest = hashlib.sha256()
    for tensor in module.state_dict().values():
        digest.update(tensor.detach().cpu().reshape(-1).contiguous().view(torch.uint8).numpy().tobytes())
    return digest.hexdigest()[:16]
