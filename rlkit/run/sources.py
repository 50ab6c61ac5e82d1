"""Rollout sources: where the batch of an RL step comes from. Three, chosen from the config by
:func:`rollout_source`:

    PlainRollouts    the step's ``num_prompts_per_step`` prompts x G samples; not scored
    DynamicSampling  DAPO: rounds of prompts, each scored, groups whose rewards vary kept until the batch is
                     full (at most ``dynamic_sampling_max_gen_batches`` rounds); scored, since it scores to choose
    AsyncSource      async GRPO: the next ready batch of a background producer (:class:`AsyncRollouts`) that
                     makes each batch as the plain or the dynamic source would

Why one interface: ``Session.rollout()`` and ``step()`` ask the source for the current step's batch and never
look at the mode; a batch comes back scored or not (``rewards is None``) and ``Session.score()`` scores only
what has no rewards yet. The sources get the session's sampling and scoring as functions (:data:`SampleFn`,
:data:`ScoreFn`), so they hold no engine and read the live config through them. With a multi-turn environment
(``env.max_turns > 1``) the session's sample function plays whole conversations, scored as they are played
(:mod:`rlkit.stages.conversations`), so every source, async GRPO's producer included, carries them unchanged.

The synchronous sources take the step's prompts from :meth:`RunState.rows_for_step`, one flat list drawn once
per step: the plain source uses the first ``n``, dynamic sampling rounds of ``n`` (all rounds' rows drawn up
front). Switching between them within a step reuses the drawn rows and draws only the missing ones.

Deliberate simplifications: a synchronous source samples again when asked twice within a step (same prompts,
seed and weights: the same batch). The async source draws its prompts in the producer thread and ignores a
``seed`` override; a restarted one (a checkpoint restore, a ``configure`` of the rollouts) counts its batches,
hence their seeds, from 0 again, and the prompts its predecessor had drawn for queued batches are skipped.
"""
from __future__ import annotations

import warnings
from contextlib import nullcontext
from typing import Callable, ContextManager, Sequence

from rlkit.config.run import RunConfig
from rlkit.run.async_rollouts import AsyncRollouts
from rlkit.run.state import RunState
from rlkit.stages.dynamic_sampling import dynamic_sampling
from rlkit.trajectories import Trajectories

SampleFn = Callable[[Sequence[dict], int, int], Trajectories]  # (rows, sampling seed, generator version) -> batch
ScoreFn = Callable[[Trajectories], Trajectories]  # batch -> the batch with rewards
ROUND_SEED_STRIDE = 7919  # dynamic sampling's round r samples with seed + r * stride


def step_seed(run_seed: int, step: int) -> int:
    """The sampling seed of step (or async batch) ``step`` of a run seeded ``run_seed``."""
    return run_seed * 1_000_003 + step


def warn_if_off_policy(generator_version: int, policy_version: int) -> None:
    if generator_version != policy_version:
        warnings.warn(f"the generator holds policy version {generator_version}, the policy is at {policy_version}: "
                      "these samples are off-policy (call session.refit() first)", stacklevel=4)


class RolloutSource:
    """The batch of each RL step. Synchronous sources implement :meth:`make` and ``rows_per_step``."""

    rows_per_step: int  # prompt rows one batch is made from

    def make(self, rows: Sequence[dict], seed: int, generator_version: int) -> Trajectories:
        """One batch from ``rows_per_step`` prompt rows, sampled with ``seed`` by the generator at that version."""
        raise NotImplementedError

    def batch(self, run: RunState, seed: int, generator_version: int, policy_version: int) -> Trajectories:
        """The batch of step ``run.step`` (from ``run``'s prompt rows for that step)."""
        warn_if_off_policy(generator_version, policy_version)
        return self.make(run.rows_for_step(self.rows_per_step), seed, generator_version)

    def exclusive(self) -> ContextManager[None]:
        """Hold the generator (a refit, an evaluation, explicit rows) while nothing else samples."""
        return nullcontext()

    def weights_loaded(self, version: int, step: int) -> None:
        """The generator now holds policy ``version``, loaded after ``step`` completed RL steps."""

    def step_timings(self) -> dict[str, float]:
        """Wall-clock metrics of the last step that only this source measures."""
        return {}

    def close(self) -> None:
        """Stop sampling in the background, if the source does."""


class PlainRollouts(RolloutSource):
    def __init__(self, sample: SampleFn, num_prompts: int):
        self.sample, self.num_prompts, self.rows_per_step = sample, num_prompts, num_prompts

    def make(self, rows: Sequence[dict], seed: int, generator_version: int) -> Trajectories:
        return self.sample(rows, seed, generator_version)

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.num_prompts} prompts per step)"


class DynamicSampling(PlainRollouts):
    def __init__(self, sample: SampleFn, score: ScoreFn, num_prompts: int, max_rounds: int):
        super().__init__(sample, num_prompts)
        self.score, self.max_rounds, self.rows_per_step = score, max_rounds, num_prompts * max_rounds

    def make(self, rows: Sequence[dict], seed: int, generator_version: int) -> Trajectories:
        n = self.num_prompts

        def sample_and_score(r: int) -> Trajectories:
            return self.score(self.sample(rows[r * n:(r + 1) * n], seed + ROUND_SEED_STRIDE * r, generator_version))

        return dynamic_sampling(sample_and_score, n, self.max_rounds)

    def __repr__(self) -> str:
        return f"DynamicSampling({self.num_prompts} prompts per step, at most {self.max_rounds} rounds)"


class AsyncSource(RolloutSource):
    """Async GRPO over ``inner``: batch ``i`` is ``inner.make`` of the sampler's next rows with the seed of
    step ``i``, sampled in the producer thread (see :mod:`rlkit.run.async_rollouts`)."""

    def __init__(self, inner: RolloutSource, run: RunState, run_seed: int, max_age_steps: int,
                 updates_per_step: Callable[[], int], generator_version: int):
        def make_batch(index: int, version: int) -> Trajectories:
            return inner.make(run.sampler.next_batch(inner.rows_per_step), step_seed(run_seed, index), version)

        self.inner, self.updates_per_step = inner, updates_per_step
        self.producer = AsyncRollouts(make_batch, max_age_steps, generator_version, step=run.step)

    def batch(self, run: RunState, seed: int, generator_version: int, policy_version: int) -> Trajectories:
        return self.producer.batch_for_step(run.step, policy_version, self.updates_per_step())

    def exclusive(self) -> ContextManager[None]:
        return self.producer.exclusive()

    def weights_loaded(self, version: int, step: int) -> None:
        self.producer.weights_loaded(version, step)

    def step_timings(self) -> dict[str, float]:
        return {"timing/refit_wait": self.producer.last_exclusive_wait}  # the refit waited for the batch in sampling

    def close(self) -> None:
        self.producer.close()

    def __repr__(self) -> str:
        return f"async rollouts of {self.inner!r}: {self.producer!r}"


def rollout_source(config: RunConfig, sample: SampleFn, score: ScoreFn, run: RunState, generator_version: int,
                   updates_per_step: Callable[[], int]) -> RolloutSource:
    """The source ``config.grpo`` asks for (``use_dynamic_sampling``, ``async_grpo.enabled``) over ``run``."""
    g = config.grpo
    source = (DynamicSampling(sample, score, g.num_prompts_per_step, g.dynamic_sampling_max_gen_batches)
              if g.use_dynamic_sampling else PlainRollouts(sample, g.num_prompts_per_step))
    if not g.async_grpo.enabled:
        return source
    return AsyncSource(source, run, config.seed, g.async_grpo.max_trajectory_age_steps,
                       updates_per_step, generator_version)
