"""Refit stage: push the policy's weights into the generator (see :mod:`rlkit.weight_sync`).

What either side lets go of around a refit (the optimizer state, the gradient buffers, a frozen base) is the
hand-off's business (:class:`rlkit.weight_sync.handoff.Handoff`, whose ``before_refit()`` a run calls first);
this stage moves the weights only.
"""

from __future__ import annotations

from rlkit.generation.base import Generator
from rlkit.policy.base import Policy
from rlkit.weight_sync import ColocatedWeightSync, RefitReport, WeightSync


def refit(policy: Policy, generator: Generator, sync: WeightSync | None = None) -> RefitReport:
    """The policy's weights into the generator by ``sync`` (default: a colocated, in-process sync)."""
    return (sync or ColocatedWeightSync()).sync(policy, generator)
