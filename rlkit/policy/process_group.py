"""The default torch.distributed group the in-process policies share: who creates it, and who destroys it.

Each gloo group runs two worker threads and a transport loop, and the default group's rendezvous store a
server thread and sockets, so a group left alive leaks them. :func:`acquire_process_group` creates it for
the first in-process policy that needs one (from ``RANK``/``WORLD_SIZE`` in a Ray worker, else a
single-process group, its store in memory) and :func:`release_process_group` destroys it when its last
holder releases it; one that was there before (your script's) is left alone. vLLM's in-process engine uses
the group it finds, and its shutdown destroys the default group whoever made it (vLLM's
``cleanup_dist_env_and_memory``); a release after that has nothing left to do.
"""

from __future__ import annotations

import os

import torch
import torch.distributed as dist

_created_group = None  # the default group acquire_process_group() created, until its last holder releases it
_holders = 0  # acquire_process_group() calls not yet released


def acquire_process_group() -> None:
    """A default torch.distributed group exists, held for the caller until its :func:`release_process_group`:
    the one already there (a launcher's, or one acquired before), or a new one from ``RANK``/``WORLD_SIZE``
    (a Ray worker), or else a single-process group: gloo, and where CUDA is present NCCL for CUDA tensors
    beside gloo for host tensors (gloo refuses CUDA tensors; Megatron's DDP reduces its CUDA gradient
    buffers through the default group even at one rank)."""
    global _created_group, _holders
    if not dist.is_initialized():
        if "RANK" in os.environ and "WORLD_SIZE" in os.environ:
            dist.init_process_group("nccl" if torch.cuda.is_available() else "gloo")
        else:
            # one process needs no rendezvous: an in-memory store, no port (a port picked free and bound later
            # could be taken in between by another process starting a group)
            backend = "cpu:gloo,cuda:nccl" if torch.cuda.is_available() else "gloo"
            dist.init_process_group(backend, store=dist.HashStore(), rank=0, world_size=1)
        _created_group = dist.group.WORLD
    _holders += 1


def release_process_group() -> None:
    """Undo one :func:`acquire_process_group`; the last release destroys the default group if it is the one
    acquiring created (it may be gone already: vLLM's engine shutdown destroys it)."""
    global _created_group, _holders
    _holders = max(0, _holders - 1)
    if _holders == 0 and _created_group is not None:
        if dist.is_initialized() and dist.group.WORLD is _created_group:
            dist.destroy_process_group()
        _created_group = None
