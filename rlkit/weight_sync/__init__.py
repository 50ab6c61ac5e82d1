"""Moving the policy's weights into the generator: one ``sync(policy, generator) -> RefitReport`` per mode."""

from typing import Protocol, runtime_checkable

from rlkit.generation.base import Generator
from rlkit.weight_sync.broadcast import BroadcastReceiver, BroadcastWeightSync, RanksBroadcastWeightSync
from rlkit.weight_sync.colocated import ColocatedWeightSync, RefitReport, SharedWeights
from rlkit.weight_sync.handoff import Handoff, before_engine_starts
from rlkit.weights import WeightSource


@runtime_checkable
class WeightSync(Protocol):
    def sync(self, policy: WeightSource, generator: Generator) -> RefitReport:
        """Push the policy's current weights into the generator; the report says which version it holds."""
        ...


__all__ = ["BroadcastReceiver", "BroadcastWeightSync", "ColocatedWeightSync", "Handoff", "RanksBroadcastWeightSync",
           "RefitReport", "SharedWeights", "WeightSync", "before_engine_starts"]
