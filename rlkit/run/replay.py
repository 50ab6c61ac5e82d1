"""``session.replay(step, loss=..., estimator=..., **overrides)``: what step ``step`` would have computed under
another loss or advantage estimator, on its own batch and the weights it started from.

How: the step's record (:mod:`rlkit.run.history`) holds its batch, loss and advantage settings, and a snapshot
holds the weights its update started from. Those weights are swapped into the live policy for the computation
and the live ones put back (:func:`rlkit.policy.snapshots.weights_swapped_in`); the gradients are computed as
the train step computes them and cleared after; every RNG state is captured before and restored after. The live
session's weights, optimizer state, run state and RNG are bit for bit as before (tests/run/test_replay.py).

What it returns (:class:`ReplayReport`): the replayed loss's metrics, gradient norm and per-token maps, and the
cosine between its gradient and the gradient the step took, recomputed from the step's own loss at the same
weights (the recomputation reproduces the recorded loss and gradient norm: ``report.recorded`` against
``report.taken``, within 1e-6 in fp32).

Deliberate simplifications: a step that took several optimizer updates (epochs or minibatches) is replayed as
one gradient over its whole batch at the weights it started from (its recorded figures are the mean over its
updates, so they are not reproduced); an estimator with state of its own (reinforce_baseline) starts from a
fresh baseline.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any, Callable, Optional

from torch import Tensor

from rlkit.algorithms import LossParams, RLLoss, RunningBaseline
from rlkit.policy.base import LossFn
from rlkit.policy.per_token import TokenLoss, evaluate_loss_per_token
from rlkit.policy.snapshots import gradient, weights_swapped_in
from rlkit.rng import capture, restore
from rlkit.run.history import RolloutHistory
from rlkit import stages
from rlkit.stages.compare import token_frame
from rlkit.trajectories import Trajectories


def loss_variant(base: LossFn, loss: Any = None, overrides: Optional[dict[str, Any]] = None) -> LossFn:
    """The loss ``loss`` names: None, ``base`` with ``overrides`` (``loss_fn.*`` keys without the prefix); a policy
    loss name, ``base``'s settings with that policy loss and ``overrides``; a loss function, itself."""
    overrides = dict(overrides or {})
    if loss is not None and not isinstance(loss, str):
        if overrides:
            raise ValueError(f"overrides {sorted(overrides)} apply to a loss named by its policy loss (e.g. "
                             "loss='gspo'), not to a loss function given whole")
        return loss
    if loss is None and not overrides:
        return base
    params = base.params if isinstance(base, RLLoss) else LossParams()
    if loss is not None:
        overrides["policy_loss"] = loss
    return RLLoss(dataclasses.replace(params, **overrides), kl_in_reward=getattr(base, "kl_in_reward", False))


@dataclass(frozen=True)
class ReplayReport:
    """Step ``step`` replayed under ``loss_fn``: see the module docstring."""

    step: int
    loss_fn: str  # the replayed loss, described
    batch: Trajectories  # the step's batch (with the replayed estimator's advantages, if one was given)
    replayed: TokenLoss  # the replayed loss's metrics and per-token maps
    grad_norm: float  # the replayed loss's gradient norm (before clipping)
    cosine_to_taken: float  # cos(replayed gradient, the gradient the step took)
    taken: dict[str, float]  # the step's own loss and gradient norm, recomputed: {"loss", "grad_norm"}
    recorded: dict[str, float]  # what the step recorded: {"loss", "grad_norm"}

    @property
    def metrics(self) -> dict[str, float]:
        return self.replayed.metrics

    def values(self, quantity: str = "loss") -> Tensor:
        """The replayed loss's per-token map ``quantity`` [B, T]."""
        return self.replayed.values[quantity]

    def table(self) -> Any:
        """Tidy DataFrame, one row per completion token, with every per-token map."""
        return token_frame(self.batch, self.replayed.values, step=self.step, loss_fn=self.loss_fn)

    def show(self, color: str = "loss", rows: Any = 8) -> Any:
        """The token view of the batch coloured by the replayed map ``color``."""
        return self.batch.show(self.values(color), rows=rows, label=f"replay of step {self.step}: {color}")

    def __repr__(self) -> str:
        return (f"ReplayReport(step {self.step} under {self.loss_fn}: loss={self.metrics['loss']:.6g}, "
                f"grad_norm={self.grad_norm:.6g}, cosine to the gradient taken={self.cosine_to_taken:.4f}; "
                f"the step took loss={self.taken['loss']:.6g}, grad_norm={self.taken['grad_norm']:.6g}, "
                f"recorded {self.recorded['loss']:.6g}, {self.recorded['grad_norm']:.6g})")


def replay(policy: Any, store: RolloutHistory, step: int, loss: Any = None, estimator: Any = None,
           **overrides: Any) -> ReplayReport:
    """Step ``step`` (``session.history[k].step``) of the run whose rollout history is ``store``, replayed on
    ``policy`` with ``loss`` (a policy loss name, a loss function, or None: the step's own), ``estimator`` (an
    advantage estimator name: the step's rewards get its advantages) and ``overrides`` (``loss_fn.*`` keys without
    the prefix, e.g. ``ratio_clip_max=0.28``). The caller keeps the generator's other users out meanwhile."""
    record, weights = store.record(step), store.weights(step)
    batch = record.batch
    if estimator is not None:
        batch = stages.advantages(batch, estimator, record.advantage_params, RunningBaseline())
    loss_fn = loss_variant(record.loss_fn, loss, overrides)
    rng = capture()
    try:
        with weights_swapped_in(policy, weights):
            taken = gradient(policy, record.batch, record.loss_fn)
            same = loss_fn is record.loss_fn and batch is record.batch
            replayed = taken if same else gradient(policy, batch, loss_fn)
            tokens = evaluate_loss_per_token(policy, batch, loss_fn)
    finally:
        restore(*rng)
    values = record.metrics.values
    return ReplayReport(step, stages.loss_description(loss_fn), batch, tokens, replayed.norm,
                        1.0 if same else replayed.cosine(taken),
                        {"loss": taken.metrics["loss"], "grad_norm": taken.norm},
                        {"loss": values.get("train/loss", float("nan")),
                         "grad_norm": values.get("train/grad_norm", float("nan"))})


def named_losses(base: LossFn, losses: Any, companions: Callable[[Any], dict[str, Any]]) -> dict[str, LossFn]:
    """``compare_losses``'s losses by name: a mapping name -> policy loss name or loss function, or a sequence of
    policy loss names, each a variant of ``base``; a name switched to brings the companion settings
    ``companions(name)`` gives (its preset's, as ``configure`` does)."""
    named = losses if isinstance(losses, dict) else {name: name for name in losses}
    return {key: loss_variant(base, value, companions(value)) for key, value in named.items()}
