"""configure() on a real session does what the table of changes (rlkit.config.changes) says for each kind of
change, and switching between plain and dynamic sampling within a step reuses the step's prompts.

The tests share one session (tests/session/conftest.py: 4 prompts x 4 samples) and run in file order; each
puts back what it changed."""

import pytest
import torch

from rlkit.data import PromptSampler
from rlkit.errors import ConfigError


def prompts(rows):
    return [row["prompt"] for row in rows]


def sampler_after(session, start, rows):
    """The sampler's state after drawing ``rows`` rows from ``start``."""
    sampler = PromptSampler(session.dataset["train"], 4)
    sampler.load_state_dict(start)
    sampler.next_indices(rows)
    return sampler.state_dict()


def test_a_live_change_applies_at_the_next_use(session):
    session.configure(["grpo.normalize_rewards=false"])
    batch = session.advantages(session.score(session.rollout()))
    groups = batch.rewards.view(-1, 4)
    per_sample = batch.advantages.sum(1) / batch.completion_lengths
    centred = groups - groups.mean(1, keepdim=True)
    assert torch.allclose(per_sample, centred.flatten(), atol=1e-5)  # centred only
    std = groups.std(1, keepdim=True)
    assert (torch.where(std > 0, centred / (std + 1e-6), centred) - centred).abs().max() > 0.1  # not normalised
    session.configure(["grpo.normalize_rewards=true"])


def test_a_new_number_of_prompts_reaches_the_next_rollout(session):
    start, drawn = session.sampler.state_dict(), len(session.run_state.step_rows)  # this step's rows so far
    first = session.rollout()
    assert first.num_prompts == 4
    session.configure(["grpo.num_prompts_per_step=6"])
    wider = session.rollout()
    assert wider.num_prompts == 6 and wider.batch_size == 24
    assert prompts(wider.rows)[:4] == prompts(first.rows)  # the step's prompts are kept, 2 more drawn
    assert session.sampler.state_dict() == sampler_after(session, start, 6 - drawn)
    session.step()
    assert session.history[-1]["timing/samples_per_second"] == pytest.approx(24 / session.history[-1]["timing/step_total"])
    session.configure(["grpo.num_prompts_per_step=2"])
    assert session.rollout().num_prompts == 2
    session.configure(["grpo.num_prompts_per_step=4"])
    session.step()


def test_a_loss_change_builds_a_new_loss_that_the_next_stages_use(session):
    before = session.loss_fn
    session.configure(["loss_fn.ratio_clip_max=0.3"])
    assert session.loss_fn is not before and session.loss_fn.params.ratio_clip_max == 0.3
    assert session.logprobs(session.score(session.rollout())).ref_logprobs is None  # no KL anywhere: no reference
    session.configure(["grpo.reward_kl_coef=0.01"])  # KL folded into the reward: the loss must ask for it
    assert session.loss_fn.needs_reference and session.logprobs(session.score(session.rollout())).ref_logprobs is not None
    session.configure(["grpo.reward_kl_coef=0.0", "loss_fn.ratio_clip_max=0.2"])
    assert not session.loss_fn.needs_reference


def test_an_optimizer_change_starts_a_new_optimizer_and_schedule(session):
    """The conftest config warms the learning rate up over 20 steps; a new schedule without warm-up trains
    at the new rate from its first step."""
    if session.stale:
        session.refit()
    assert session.step()["train/learning_rate"] < 1e-4
    session.configure(["policy.optimizer.lr=5e-4", "policy.scheduler.warmup_steps=0"])
    assert session.step()["train/learning_rate"] == pytest.approx(5e-4)


def test_changes_that_need_a_new_session_or_run_are_refused_and_nothing_is_applied(session):
    config, loss = session.config, session.loss_fn
    with pytest.raises(ConfigError) as err:
        session.configure(["policy.generation.temperature=0.5", "seed=3", "loss_fn.ratio_clip_max=0.25"])
    assert len(err.value.problems) == 2
    assert "policy.generation.temperature: changing it needs a new Session (Session.from_config(" in str(err.value)
    assert "seed: changing it needs a new run (session.reset(" in str(err.value)
    assert session.config is config and session.loss_fn is loss  # not even the loss change was applied


def test_switching_plain_and_dynamic_sampling_within_a_step(session):
    session.step()  # a new step: no prompts drawn yet
    start = session.sampler.state_dict()
    plain = session.rollout()
    assert plain.rewards is None
    session.configure(["grpo.use_dynamic_sampling=true", "grpo.dynamic_sampling_max_gen_batches=2"])
    dynamic = session.rollout()
    rows = prompts(session.run_state.step_rows)
    assert len(rows) == 8 and rows[:4] == prompts(plain.rows)  # round 0 = the plain rollout's prompts
    assert session.sampler.state_dict() == sampler_after(session, start, 8)  # only round 1's rows drawn
    assert dynamic.rewards is not None and dynamic.info["dynamic_sampling/tries"] >= 1
    assert set(prompts(dynamic.rows)) <= set(rows)
    assert session.score(dynamic) is dynamic  # already scored: kept as it is
    metrics = session.step()
    assert session.batch.info["dynamic_sampling/kept_groups"] >= 1 and metrics["rollout/reward_std"] > 0

    start = session.sampler.state_dict()  # next step: dynamic first, then plain
    session.rollout()
    session.configure(["grpo.use_dynamic_sampling=false"])
    plain = session.rollout()
    assert plain.rewards is None and plain.num_prompts == 4
    assert prompts(plain.rows) == prompts(session.run_state.step_rows[:4])  # the first round's prompts
    assert session.sampler.state_dict() == sampler_after(session, start, 8)  # nothing more drawn
    session.step()
    assert session.run_state.step_rows == [] and session.rollout().rewards is None
