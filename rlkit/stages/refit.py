"""Refit stage: push the policy's weights into the generator (see :mod:`rlkit.weight_sync`)."""

from __future__ import annotations

from rlkit.generation.base import Generator
from rlkit.policy.base import Policy
from rlkit.weight_sync import ColocatedWeightSync, RefitReport, WeightSync


def refit(policy: Policy, generator: Generator, sync: WeightSync | None = None) -> RefitReport:
    return (sync or ColocatedWeightSync()).sync(policy, generator)
