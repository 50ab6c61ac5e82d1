"""Moving the policy's weights into the generator: one ``sync(policy, generator) -> RefitReport`` per mode."""

from typing import Any, Protocol, runtime_checkable

from rlkit.weight_sync.broadcast import BroadcastWeightSync
from rlkit.weight_sync.colocated import ColocatedWeightSync, RefitReport


@runtime_checkable
class WeightSync(Protocol):
    def sync(self, policy: Any, generator: Any) -> RefitReport:
        """Push the policy's current weights into the generator; the report says which version it holds."""
        ...


__all__ = ["BroadcastWeightSync", "ColocatedWeightSync", "RefitReport", "WeightSync"]
