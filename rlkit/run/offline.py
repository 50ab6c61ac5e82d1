"""The stages that train on fixed data rather than the policy's own samples: SFT warm starts, DPO, and a reward model
trained beside the policy. Each SFT and DPO call continues the last (its rows, optimizer and schedule, kept in the
run's state as a :class:`rlkit.stages.WarmStart`); the first RL update hands the RL optimizer back
(:func:`hand_back`). :class:`rlkit.run.run.Run` calls these with the parts they read and refits after.
"""

from __future__ import annotations

import tempfile
from pathlib import Path
from typing import Any, Mapping, Optional, Sequence

from rlkit import stages
from rlkit.config.run import RunConfig
from rlkit.data import PromptSampler
from rlkit.data.preference import pairs_from_answers, read_preference_file
from rlkit.memory.offline import OfflineStage, plan_offline_stage
from rlkit.policy.base import Policy
from rlkit.policy.value_model import beside_the_policy
from rlkit.run.components import Components
from rlkit.run.state import RunState
from rlkit.tracking.checkpoint import export_hf

Pairs = Sequence[Mapping[str, Any]]  # prompt, chosen, rejected


def sft(policy: Policy, components: Components, state: RunState, config: RunConfig, num_steps: Optional[int],
        progress: bool) -> stages.SFTResult:
    """Supervised steps on the task's answers, continuing the run's warm start (see :meth:`rlkit.Session.sft`)."""
    settings = stages.SFTSettings.from_config(config, num_steps)
    if state.warm_start is None:  # later calls continue it: the next rows, the same optimizer and schedule
        rows = PromptSampler(components.dataset["train"], settings.sft.batch_size, seed=config.seed + 1)
        state.warm_start = stages.WarmStart(rows)
    state.last_sft = stages.sft(policy, components.tokenizer, state.warm_start, settings, progress,
                                keep_optimizer=True)
    return state.last_sft


def dpo(policy: Policy, components: Components, state: RunState, config: RunConfig, num_steps: Optional[int],
        progress: bool, pairs: Optional[Pairs], rl_needs_reference: bool) -> stages.DPOResult:
    """DPO on ``pairs``, ``dpo.train_file``'s or the task's answers' (see :meth:`rlkit.Session.dpo`); the reference
    is held while it runs, then as the RL loss needs it (``rl_needs_reference``)."""
    refuse_unless_stage_fits(config, "dpo")
    settings = stages.DPOSettings.from_config(config, num_steps)
    cfg = config.dpo
    if pairs is not None:  # new pairs: the run's reference, optimizer and schedule carry on
        if not pairs:
            raise ValueError("dpo(pairs=[]) has no pairs to train on; a batch whose samples all earned a reward "
                             "gives none (pairs_from_batch): sample more prompts or at a higher temperature")
        sampler = PromptSampler([dict(p) for p in pairs], cfg.batch_size, seed=config.seed + 2)
        if state.preference is None:
            state.preference = stages.WarmStart(sampler)
        state.preference.sampler = sampler
    if state.preference is None:  # later calls continue it: the next pairs, the same optimizer and schedule
        pairs = (read_preference_file(cfg.train_file) if cfg.train_file
                 else pairs_from_answers(components.dataset["train"], config.seed + 2, config.sft.response_key))
        state.preference = stages.WarmStart(PromptSampler(pairs, cfg.batch_size, seed=config.seed + 2))
    if state.warm_start is not None:  # an SFT warm start's optimizer ends where DPO's begins
        state.warm_start.hand_back(policy, settings.sft)
    policy.keep_reference(True)  # DPO reads the reference every step, whatever the RL loss needs
    try:
        state.last_dpo = stages.dpo(policy, components.tokenizer, state.preference, settings, progress)
    finally:
        policy.keep_reference(rl_needs_reference)
    return state.last_dpo


def train_reward_model(policy: Policy, components: Components, config: RunConfig, output: str | Path,
                       pairs: Optional[Pairs], eval_pairs: Optional[Pairs], base: Optional[str | Path],
                       progress: bool) -> stages.RewardModelResult:
    """A reward model on preference pairs, from ``base`` or the policy as it is now (see
    :meth:`rlkit.Session.train_reward_model`); the policy is not changed."""
    refuse_unless_stage_fits(config, "reward_model")
    seed, key, dataset = config.seed + 3, config.sft.response_key, components.dataset
    if pairs is None and config.dpo.train_file:
        pairs = read_preference_file(config.dpo.train_file)
    elif pairs is None:  # the task's answers against near misses, and the held-out rows' the same way
        pairs = pairs_from_answers(dataset["train"], seed, key)
        eval_pairs = pairs_from_answers(dataset["validation"], seed + 1, key) if eval_pairs is None else eval_pairs
    with tempfile.TemporaryDirectory(prefix="rlkit-rm-base-") as scratch:
        if base is None:  # the policy as it is now (merged with its adapters)
            base = export_hf(policy, config.policy, Path(scratch) / "base")
        return stages.train_reward_model(base, pairs, output, config.reward_model, eval_pairs=eval_pairs or (),
                                         system_prompt=config.data.system_prompt, seed=seed, progress=progress,
                                         policy=beside_the_policy(config.policy))


def refuse_unless_stage_fits(config: RunConfig, stage: OfflineStage) -> None:
    """Before ``stage`` holds its second model (DPO's reference, the reward model): the run's memory plan with the
    stage's line (:func:`rlkit.memory.offline.plan_offline_stage`, at the policy's model shape), refused with the
    table and the switches that would help when it does not fit this machine's device, as a session's start is
    (``RLKIT_SKIP_MEMORY_PLAN=1`` runs it anyway). Nothing is loaded or changed before the refusal."""
    plan_offline_stage(config, stage).refuse_if_over(config)


def hand_back(policy: Policy, state: RunState, settings: stages.SFTSettings) -> None:
    """The RL optimizer and schedule (fresh) back in the policy where an SFT or DPO run's are (before the first RL
    update and a checkpoint); the next ``sft()``/``dpo()`` then starts a new optimizer on the rows after the last."""
    for warm in (state.warm_start, state.preference):
        if warm is not None:
            warm.hand_back(policy, settings)


def forget_optimizers(state: RunState) -> None:
    """After the RL optimizer was replaced from outside: no SFT or DPO run's optimizer is in the policy any more."""
    for warm in (state.warm_start, state.preference):
        if warm is not None:
            warm.optimizer_active = False
