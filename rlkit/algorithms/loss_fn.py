"""``RLLoss``: the training loss the policy's train step calls once per microbatch.

    loss, metrics = loss_fn(logprobs [b, T] (requires grad), batch: Trajectories (a microbatch), counts)

    per-token  l_t = policy_loss(logprobs, old, A, mask)_t * w_t + beta * kl_t
    loss           = aggregate(l, mask, counts)

with ``old = batch.prev_logprobs`` (or ``logprobs.detach()`` when absent: on-policy), ``w`` the off-policy
correction between ``prev_logprobs`` and ``batch.generator_logprobs``, ``beta =
reference_policy_kl_penalty`` and ``kl`` the per-token estimate against ``batch.ref_logprobs``. Every piece
is looked up by name in a registry (``losses``, ``correction``, ``kl``, ``aggregation``).

Metric contract: every value is this microbatch's contribution normalised by the *global* ``counts``
(0-dim, detached), so summing the dicts of all microbatches (and ranks) gives the whole-batch value.
Token-level metrics are sums over the microbatch's valid tokens divided by ``counts.valid_tokens``.
"""

from __future__ import annotations

import torch
from torch import Tensor

from rlkit.algorithms.aggregation import AGGREGATIONS
from rlkit.algorithms.correction import CORRECTIONS, mult_prob_error_sum
from rlkit.algorithms.kl import kl_penalty
from rlkit.algorithms.losses import POLICY_LOSSES
from rlkit.algorithms.params import LossParams
from rlkit.errors import StageOrderError
from rlkit.notebook.html import CodeRepr
from rlkit.trajectories import LossCounts, Trajectories


class RLLoss(CodeRepr):
    """Callable loss built from ``LossParams``; see the module docstring for the formula and metrics.

    ``kl_in_reward`` tells the loss that the advantage estimator folded KL into the reward (REINFORCE++
    with ``AdvantageParams.kl_coef != 0``), so ``needs_reference`` is True even with a zero KL penalty.
    """

    def __init__(self, params: LossParams = LossParams(), *, kl_in_reward: bool = False):
        self.params = params
        self.kl_in_reward = kl_in_reward
        self._policy_loss = POLICY_LOSSES.get(params.policy_loss)
        self._correction = CORRECTIONS.get(params.off_policy_correction)
        self._aggregate = AGGREGATIONS.get(params.aggregation)
        self._policy_params = params.policy_params()
        self._correction_params = params.correction_params()

    @property
    def needs_reference(self) -> bool:
        """Whether the caller must fill ``batch.ref_logprobs`` (else it can skip the reference forward)."""
        return self.params.reference_policy_kl_penalty != 0 or self.kl_in_reward

    def _kl(self, logprobs: Tensor, ref: Tensor, mask: Tensor) -> Tensor:  # [b, T]
        """The per-token KL estimate with both sides 0 outside the completion (ref_logprobs already is): k3's exp()
        cannot overflow there, which the masked aggregation would turn into NaN gradients."""
        return kl_penalty(torch.where(mask, logprobs, 0.0), torch.where(mask, ref, 0.0), self.params.kl_estimator,
                          self.params.kl_clamp)

    def __call__(self, logprobs: Tensor, batch: Trajectories, counts: LossCounts) -> tuple[Tensor, dict[str, Tensor]]:
        p = self.params
        mask = batch.loss_mask.bool()  # [b, T]
        if logprobs.shape != mask.shape:
            raise ValueError(f"logprobs {tuple(logprobs.shape)} do not match loss_mask {tuple(mask.shape)}")
        advantages = batch.require("advantages", "advantages()")  # [b, T]
        old = batch.prev_logprobs if batch.prev_logprobs is not None else logprobs.detach()  # [b, T]
        ref = batch.ref_logprobs
        if p.reference_policy_kl_penalty != 0 and ref is None:
            raise StageOrderError(f"reference_policy_kl_penalty={p.reference_policy_kl_penalty} needs ref_logprobs, "
                                  "but this batch has none: run logprobs() with the reference policy (it does when "
                                  "loss_fn.needs_reference), or set reference_policy_kl_penalty=0")

        def agg(values: Tensor) -> Tensor:
            return self._aggregate(values, mask, counts, p.seq_sum_constant)

        correction = self._correction(old, batch.generator_logprobs, mask, self._correction_params)
        pg, pg_maps = self._policy_loss(logprobs, old, advantages, mask, self._policy_params)
        pg_loss = agg(pg * correction.weights)
        kl = None  # [b, T]
        if ref is not None:  # without a KL penalty, a metric only
            with torch.set_grad_enabled(torch.is_grad_enabled() and p.reference_policy_kl_penalty != 0):
                kl = self._kl(logprobs, ref, mask)
        kl_loss = (agg(p.reference_policy_kl_penalty * kl) if p.reference_policy_kl_penalty != 0
                   else torch.zeros((), dtype=pg_loss.dtype, device=pg_loss.device))
        loss = pg_loss + kl_loss

        n_tokens = max(counts.valid_tokens, 1)

        def token_share(values: Tensor) -> Tensor:  # this microbatch's share of the global token mean
            return torch.where(mask, values.detach().float(), 0.0).sum() / n_tokens

        zero = torch.zeros((), device=mask.device)
        metrics = {"loss": loss.detach(), "pg_loss": pg_loss.detach(), "kl_penalty": kl_loss.detach()}
        metrics.update({name: token_share(value) for name, value in pg_maps.items()})
        metrics["kl"] = token_share(kl) if kl is not None else zero
        if batch.entropy is not None:
            metrics["approx_entropy"] = token_share(batch.entropy)
        metrics["token_mult_prob_error"] = mult_prob_error_sum(old, batch.generator_logprobs, mask).float() / n_tokens
        metrics.update(correction.metrics(mask, counts))
        return loss, metrics

    @torch.no_grad()
    def per_token(self, logprobs: Tensor, batch: Trajectories, counts: LossCounts) -> dict[str, Tensor]:
        """What each token adds to the loss, and why: maps ``[b, T]`` (float32, 0 outside ``loss_mask``) for the
        same ``logprobs`` [b, T], ``batch`` and global ``counts`` as :meth:`__call__`:

            loss       the token's contribution: c_t * l_t, with c_t = d aggregate / d l_t (every aggregation is
                       linear in l), so the contributions of all tokens of all microbatches sum to the loss
            pg_loss    l_t's policy-gradient part, before aggregation: policy_loss_t * correction weight_t
            ratio      r_t (GSPO: the sequence ratio on each token), as the policy loss reports it
            clipped    1 where a clip stopped the token's gradient (CISPO: truncated its weight), else 0
            advantage  A_t
            kl         the per-token KL estimate against ``ref_logprobs`` (0 when the batch has none)
            weight     the off-policy correction's weight w_t (1 without a correction)
        """
        p = self.params
        mask = batch.loss_mask.bool()
        advantages = batch.require("advantages", "advantages()")
        old = batch.prev_logprobs if batch.prev_logprobs is not None else logprobs
        correction = self._correction(old, batch.generator_logprobs, mask, self._correction_params)
        pg, maps = self._policy_loss(logprobs, old, advantages, mask, self._policy_params)
        per = pg * correction.weights
        ref = batch.ref_logprobs
        kl = self._kl(logprobs, ref, mask) if ref is not None else torch.zeros_like(logprobs)
        total = per + p.reference_policy_kl_penalty * kl if p.reference_policy_kl_penalty != 0 else per
        with torch.enable_grad():  # c_t: the aggregation's gradient with respect to each token's value
            probe = torch.zeros(mask.shape, dtype=torch.float32, device=mask.device, requires_grad=True)
            self._aggregate(probe, mask, counts, p.seq_sum_constant).backward()
        values = {"loss": probe.grad * total, "pg_loss": per, "ratio": maps["probs_ratio"],
                  "clipped": maps["clipped_fraction"], "advantage": advantages, "kl": kl,
                  "weight": correction.weights.expand_as(per)}
        return {k: torch.where(mask, v.float(), 0.0) for k, v in values.items()}

    def __repr__(self) -> str:
        p = self.params
        loss_name = p.policy_loss if isinstance(p.policy_loss, str) else getattr(p.policy_loss, "__name__", "custom")
        parts = [loss_name, f"clip=({p.ratio_clip_min}, {p.ratio_clip_max})", f"aggregation={p.aggregation}"]
        if p.reference_policy_kl_penalty:
            parts.append(f"kl={p.reference_policy_kl_penalty}*{p.kl_estimator}")
        if p.off_policy_correction != "none":
            parts.append(f"correction={p.off_policy_correction}")
        return "RLLoss(" + ", ".join(parts) + ")"
