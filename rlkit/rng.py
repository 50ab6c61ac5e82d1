"""Every random number generator a run draws from, with one owner: seed, capture, restore.

Python's, numpy's and torch's (CPU, and each CUDA device where present) are handled here. A backend with RNG
state of its own (Megatron's tracked model-parallel RNG states) registers a :class:`Tracker` when its module
is imported, so this module imports no backend; a tracker that is not live (no such policy in this process)
is skipped. A checkpoint keeps what :func:`capture` returns and gives it to :func:`restore`.
"""

from __future__ import annotations

import random
from dataclasses import dataclass
from typing import Any, Callable, Mapping, Optional

import numpy as np
import torch


@dataclass(frozen=True)
class Tracker:
    """A backend's own RNG states, as hooks."""

    seed: Callable[[int], None]  # reseed them (nothing when not live)
    get_states: Callable[[], Optional[dict[str, torch.Tensor]]]  # name -> state; None when not live
    set_states: Callable[[dict[str, torch.Tensor]], None]


_trackers: dict[str, Tracker] = {}


def register_tracker(name: str, tracker: Tracker) -> None:
    """Seed, capture and restore ``tracker`` with the rest from now on (its states kept as ``name/<state>``)."""
    _trackers[name] = tracker


def seed(value: int) -> None:
    """Seed python, numpy, torch (every CUDA device too) and every registered tracker with ``value``."""
    random.seed(value)
    np.random.seed(value)
    torch.manual_seed(value)
    torch.cuda.manual_seed_all(value)  # (nothing without CUDA)
    for tracker in _trackers.values():
        tracker.seed(value)


def capture() -> tuple[dict[str, torch.Tensor], dict[str, Any]]:
    """Every RNG state: tensors (torch CPU, ``cuda/<i>``, ``<tracker>/<state>``) and JSON-able python and numpy."""
    tensors = {"torch_cpu": torch.get_rng_state()}
    if torch.cuda.is_available():
        tensors.update({f"cuda/{i}": state for i, state in enumerate(torch.cuda.get_rng_state_all())})
    for name, tracker in _trackers.items():
        tensors.update({f"{name}/{key}": state for key, state in (tracker.get_states() or {}).items()})
    version, mt, gauss = random.getstate()
    kind, keys, pos, has_gauss, cached = np.random.get_state()
    meta = {"python": [version, list(mt), gauss],
            "numpy": [kind, keys.tolist(), int(pos), int(has_gauss), float(cached)]}
    return tensors, meta


def restore(tensors: Mapping[str, torch.Tensor], meta: Mapping[str, Any]) -> None:
    """Put back what :func:`capture` returned (a tracker's states only where it is live)."""
    torch.set_rng_state(tensors["torch_cpu"])
    cuda = [tensors[k] for k in sorted((k for k in tensors if k.startswith("cuda/")), key=lambda k: int(k[5:]))]
    if cuda and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(cuda)
    for name, tracker in _trackers.items():
        states = {k.split("/", 1)[1]: v for k, v in tensors.items() if k.startswith(f"{name}/")}
        if states and tracker.get_states() is not None:
            tracker.set_states(states)
    version, mt, gauss = meta["python"]
    random.setstate((version, tuple(mt), gauss))
    kind, keys, pos, has_gauss, cached = meta["numpy"]
    np.random.set_state((kind, np.asarray(keys, dtype=np.uint32), pos, has_gauss, cached))
