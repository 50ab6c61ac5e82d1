"""rlkit.rng owns every RNG: seeding, capture and restore, and a backend's tracker as a hook."""

import random

import numpy as np
import torch

from rlkit import rng


def draws():
    return random.random(), float(np.random.rand()), float(torch.rand(()))


def test_seed_capture_and_restore_cover_python_numpy_torch_and_a_registered_tracker(monkeypatch):
    state = {"live": True, "seeded": None, "states": {"dropout": torch.tensor([1, 2])}}
    tracker = rng.Tracker(seed=lambda s: state.update(seeded=s),
                          get_states=lambda: dict(state["states"]) if state["live"] else None,
                          set_states=lambda states: state.update(states=dict(states)))
    monkeypatch.setattr(rng, "_trackers", {})
    rng.register_tracker("toy", tracker)

    rng.seed(7)
    first = draws()
    rng.seed(7)
    assert draws() == first and state["seeded"] == 7
    tensors, meta = rng.capture()
    assert torch.equal(tensors["toy/dropout"], torch.tensor([1, 2]))
    expected = draws()
    state["states"] = {"dropout": torch.tensor([9, 9])}
    rng.restore(tensors, meta)
    assert draws() == expected and torch.equal(state["states"]["dropout"], torch.tensor([1, 2]))

    state["live"] = False  # a tracker that is not live is neither captured nor restored
    tensors, meta = rng.capture()
    assert not any(k.startswith("toy/") for k in tensors)
