"""Moving the policy's weights into the generator: one ``sync(policy, generator) -> RefitReport`` per mode."""

from rlkit.weight_sync.colocated import ColocatedWeightSync, RefitReport

__all__ = ["ColocatedWeightSync", "RefitReport"]
