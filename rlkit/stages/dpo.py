"""DPO: optimizer steps on preference pairs (``prompt``, ``chosen``, ``rejected``) against a frozen reference.

One step (:func:`dpo_step`): the pairs become one batch of 2N rows (the N chosen responses, then the N rejected, in
the same order; :func:`preference_batch`); the reference's and the policy's logprobs of every response token
(two forward passes, no gradient); the loss of each pair and each token's weight in the gradient
(:func:`rlkit.algorithms.preference.dpo_token_weights`); then one train step whose loss is ``sum(weight *
logprob)``, which has the DPO gradient exactly, in whatever microbatches the policy cuts the rows
(the algorithm module says why). The logged loss and rewards are those of the pairs before the update, as TRL's.

The reference is the policy as the first DPO step starts (:func:`dpo` calls ``set_reference_to_current`` then;
with adapters, the reference is the base with adapters off as everywhere in rlkit). Later calls continue the same
pairs' order, optimizer and schedule (a :class:`rlkit.stages.sft.WarmStart`, as SFT's).
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any

import torch
from tqdm.auto import tqdm

from rlkit.algorithms.preference import dpo_token_weights
from rlkit.policy.base import Policy
from rlkit.stages.settings import DPOSettings
from rlkit.stages.sft import WarmStart, sft_batch_as_trajectories
from rlkit.trajectories import LossCounts, Trajectories


@dataclass(frozen=True)
class DPOResult:
    """Each step's loss and rewards (TRL's names: ``loss``, ``rewards/chosen``, ``rewards/rejected``,
    ``rewards/margins``, ``rewards/accuracies``), of the pairs before that step's update."""

    steps: tuple[dict[str, float], ...]
    seconds: float

    @property
    def losses(self) -> tuple[float, ...]:
        return tuple(m["loss"] for m in self.steps)

    def __repr__(self) -> str:
        last = self.steps[-1] if self.steps else None
        tail = (f"final loss {last['loss']:.4f}, margin {last['rewards/margins']:.3f}, "
                f"accuracy {last['rewards/accuracies']:.2f}") if last else "no steps"
        return f"DPOResult({len(self.steps)} steps, {tail}, {self.seconds:.1f}s)"


def preference_batch(tokenizer: Any, pairs: list[dict[str, Any]], settings: DPOSettings) -> Trajectories:
    """``pairs`` as 2N rows [2N, T]: the chosen responses, then the rejected ones, built as SFT's batches are (the
    loss mask on each response and its EOS)."""
    rows = ([{"prompt": p["prompt"], "response": p["chosen"]} for p in pairs]
            + [{"prompt": p["prompt"], "response": p["rejected"]} for p in pairs])
    sft = settings.sft
    return sft_batch_as_trajectories(tokenizer, rows, "response", sft.system_prompt, sft.tools,
                                     sft.chat_template_kwargs)


def weighted_logprob_loss(logprobs: torch.Tensor, batch: Trajectories, counts: LossCounts):
    """``sum(batch.advantages * logprobs)``: with DPO's per-token weights as ``advantages`` (already divided by the
    number of pairs), its gradient is the DPO loss's; its value is not the DPO loss (that is logged instead)."""
    loss = (batch.advantages * logprobs * batch.loss_mask).sum()
    return loss, {"weighted_logprob": loss.detach()}


def dpo_step(policy: Policy, batch: Trajectories, settings: DPOSettings) -> dict[str, float]:
    """One DPO update on ``batch`` (from :func:`preference_batch`); returns the pairs' loss and rewards before it."""
    cfg = settings.dpo
    scored = batch.loss_mask
    reference = policy.reference_logprobs(batch.input_ids, batch.attention_mask, scored=scored).logprobs
    current = policy.logprobs(batch.input_ids, batch.attention_mask, scored=scored).logprobs
    weights, pairs = dpo_token_weights(current, reference, scored, beta=cfg.beta, loss_type=cfg.loss_type,
                                       label_smoothing=cfg.label_smoothing, sft_weight=cfg.sft_weight)
    result = policy.train_step(batch.with_(advantages=weights), weighted_logprob_loss)
    return {**pairs.metrics(), "grad_norm": result.grad_norm}


def dpo(policy: Policy, tokenizer: Any, run: WarmStart, settings: DPOSettings, progress: bool = False) -> DPOResult:
    """``settings.dpo.num_steps`` DPO steps on ``run.sampler``'s pairs; the first of a run makes the policy as it
    is the reference and starts DPO's optimizer, later calls continue both (see the module docstring)."""
    t0 = time.perf_counter()
    cfg = settings.dpo
    if run.steps == 0:
        policy.set_reference_to_current()
    run.own_optimizer(policy, cfg.lr, cfg.warmup_steps)
    steps = []
    bar = tqdm(total=cfg.num_steps, desc="DPO", disable=not progress)
    try:
        for _ in range(cfg.num_steps):
            steps.append(dpo_step(policy, preference_batch(tokenizer, run.sampler.next_batch(cfg.batch_size),
                                                           settings), settings))
            run.steps += 1
            bar.update(1)
            bar.set_postfix(loss=f"{steps[-1]['loss']:.4f}", acc=f"{steps[-1]['rewards/accuracies']:.2f}")
    finally:
        bar.close()
    return DPOResult(tuple(steps), time.perf_counter() - t0)
