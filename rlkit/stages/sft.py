"""SFT warm start: supervised steps on the task's reference answers.

A random tiny model never produces a correct answer, so RL from scratch has no reward signal. Real
pipelines start RL from an instruction-tuned model; this stage plays that part. It trains with its own
optimizer settings and makes the result the KL reference policy.

Warm starts add up: a :class:`WarmStart` carries the sampler (the next rows) and whether the policy's optimizer is
still this warm start's, so ``sft(10)`` twice takes the same rows, schedule and optimizer moments as ``sft(20)``
once (a session keeps one; :meth:`rlkit.run.run.Run.sft`). ``keep_optimizer=False`` (the default) hands the RL
optimizer and schedule back at the end: fresh, as RL starts; the session passes True and hands it back at its
first RL update instead, so a warm start continues until then.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any, Mapping, Optional, Sequence

import torch
from tqdm.auto import tqdm

from rlkit.config.components import OptimizerConfig, SchedulerConfig
from rlkit.data import PromptSampler, build_sft_batch
from rlkit.policy.base import Policy
from rlkit.stages.settings import SFTSettings
from rlkit.trajectories import LossCounts, Trajectories


@dataclass(frozen=True)
class SFTResult:
    """The loss of every SFT step and the time they took."""

    losses: tuple[float, ...]  # per step, token-mean negative log-likelihood of the responses
    seconds: float

    def __repr__(self) -> str:
        last = f"{self.losses[-1]:.4f}" if self.losses else "-"
        return f"SFTResult({len(self.losses)} steps, final loss {last}, {self.seconds:.1f}s)"


def nll_loss(logprobs: torch.Tensor, batch: Trajectories, counts: LossCounts):
    """Token-mean negative log-likelihood over the global batch's response tokens."""
    loss = -(logprobs * batch.loss_mask).sum() / max(counts.valid_tokens, 1)
    return loss, {"loss": loss.detach()}


def sft_batch_as_trajectories(tokenizer: Any, rows: list[dict[str, Any]], response_key: str,
                              system_prompt: Optional[str] = None, tools: Optional[Sequence[dict[str, Any]]] = None,
                              template_kwargs: Optional[Mapping[str, Any]] = None) -> Trajectories:
    ids, attention, loss_mask = build_sft_batch(tokenizer, rows, response_key=response_key, system_prompt=system_prompt,
                                                tools=tools, template_kwargs=template_kwargs)
    return Trajectories(
        prompts=tuple(r["prompt"] for r in rows), completions=tuple(str(r[response_key]) for r in rows),
        input_ids=ids, attention_mask=attention, loss_mask=loss_mask,
        generator_logprobs=torch.zeros(ids.shape), finish_reasons=("stop",) * len(rows), group_size=1, policy_version=0,
        tokenizer=tokenizer,
    )


@dataclass
class WarmStart:
    """A warm start that a later :func:`sft` call continues."""

    sampler: PromptSampler  # the next SFT rows
    steps: int = 0  # SFT steps taken so far
    optimizer_active: bool = False  # the policy's optimizer and schedule are still this warm start's

    def own_optimizer(self, policy: Policy, lr: float, warmup_steps: int) -> None:
        """This stage's optimizer (AdamW at ``lr``, ``warmup_steps`` of linear warm-up) into ``policy``, unless
        it is there already from an earlier call."""
        if not self.optimizer_active:
            policy.reset_optimizer(OptimizerConfig(lr=lr), SchedulerConfig(warmup_steps=warmup_steps))
            self.optimizer_active = True

    def hand_back(self, policy: Policy, settings: SFTSettings) -> None:
        """The RL optimizer and schedule (fresh) into ``policy``, if the warm start's is still there; the next
        :func:`sft` call then starts a new optimizer and warm-up (on the rows after the last ones)."""
        if self.optimizer_active:
            policy.reset_optimizer(settings.rl_optimizer, settings.rl_scheduler)
            self.optimizer_active = False


def sft(policy: Policy, tokenizer: Any, warm: WarmStart, settings: SFTSettings, progress: bool = False,
        keep_optimizer: bool = False) -> SFTResult:
    """``settings.sft.num_steps`` steps on the answers of ``warm.sampler``'s batches, with a progress bar if asked;
    the warm start's own optimizer continues when ``warm.optimizer_active`` (see the module docstring)."""
    t0 = time.perf_counter()
    cfg = settings.sft
    warm.own_optimizer(policy, cfg.lr, cfg.warmup_steps)
    losses = []
    bar = tqdm(total=cfg.num_steps, desc="SFT", disable=not progress)
    try:
        for _ in range(cfg.num_steps):
            batch = sft_batch_as_trajectories(tokenizer, warm.sampler.next_batch(cfg.batch_size), cfg.response_key,
                                              settings.system_prompt, settings.tools, settings.chat_template_kwargs)
            losses.append(policy.train_step(batch, nll_loss).metrics["loss"])
            warm.steps += 1
            bar.update(1)
            bar.set_postfix(loss=f"{losses[-1]:.4f}")
    finally:
        bar.close()
        if not keep_optimizer:
            warm.hand_back(policy, settings)
        policy.set_reference_to_current()
    return SFTResult(tuple(losses), time.perf_counter() - t0)
