"""What a run is built from and keeps for its life: one record of the components, built by :mod:`rlkit.builders`."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Optional

from rlkit.generation.base import Generator
from rlkit.policy.base import Policy
from rlkit.weight_sync import Handoff, WeightSync


@dataclass
class Components:
    """The engines, the environment and the data of a run; :meth:`close` releases the engines."""

    tokenizer: Any
    dataset: Any  # DatasetDict of prompt rows: "train" and "validation"
    env: Any
    policy: Policy
    generator: Optional[Generator]
    weight_sync: Optional[WeightSync]  # refits the generator: built as one pair with it
    handoff: Optional[Handoff]  # who holds the memory when, for this policy and generator
    loss_fn: Callable  # build_loss(config), or a loss function of yours
    config_env: Any = None  # the environment built from the config's env.* (None: one given to the session)
    endpoint: Any = None  # the OpenAI-compatible endpoint over the generator, started on first use
    critic: Any = None  # PPO's value model (rlkit.policy.critic.Critic) when critic.enabled
    teacher: Optional[Policy] = None  # the frozen distillation teacher (rlkit.policy.teacher) when distillation.enabled

    def close(self) -> None:
        """Close the endpoint, the generator, the weight sync, the teacher, the policy, the critic and the environment,
        in that order; each becomes None. Safe twice."""
        for part in ("endpoint", "generator", "weight_sync", "teacher", "policy", "critic", "env"):
            component = getattr(self, part)
            if component is not None and hasattr(component, "close"):
                component.close()
            setattr(self, part, None)
        self.handoff = None
