"""What a value model holds (PPO's critic, a reward model in training: :mod:`rlkit.policy.value_model`), for the
memory plan: the causal LM's parameters without an untied LM head ([V, h]) and with a scalar head ([1, h], plus a bias
for the critic), all trained in fp32 with AdamW.

Per parameter: the weight, its gradient and AdamW's two moments are resident from the first step on (16 B); the
optimizer step adds one fp32 copy of temporaries (4 B) while it runs. On the policy's backend (``backend=policy``) the
Megatron value model holds its tensor-parallel shard: ``/ shard`` (its norms and head, replicated, are counted as
split: a few hidden-sized vectors). Checked against what a built critic and reward model allocate in
``tests/memory/test_value_model_plan.py``.
"""

from __future__ import annotations

from dataclasses import dataclass


def value_model_parameters(parameters: int, vocab: int, hidden: int, tied: bool, bias: bool) -> int:
    """A value model's parameters from its causal LM's: ``parameters`` less an untied LM head (``vocab x hidden``),
    plus the scalar head (``hidden``, and 1 with a ``bias``)."""
    return parameters - (0 if tied else vocab * hidden) + hidden + int(bias)


@dataclass(frozen=True)
class ValueModelBytes:
    """Bytes of a value model's parts on one device."""

    weights: int
    gradients: int
    optimizer_state: int  # AdamW's two moments
    optimizer_step: int  # AdamW's foreach temporaries, while it steps
    activations: int

    @property
    def resident(self) -> int:
        """Weights, gradients and moments: what stays allocated between steps."""
        return self.weights + self.gradients + self.optimizer_state

    @property
    def total(self) -> int:
        return self.resident + self.optimizer_step + self.activations


def value_model_bytes(parameters: int, shard: int = 1, activations: int = 0) -> ValueModelBytes:
    """fp32 weights, gradients, two AdamW moments and one step's temporaries of ``parameters`` split ``shard`` ways."""
    n = parameters // shard
    return ValueModelBytes(4 * n, 4 * n, 8 * n, 4 * n, activations)
