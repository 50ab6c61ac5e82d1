"""Step a session cell by cell and check every intermediate's shapes, masks and values."""

import warnings

import pytest
import torch

from rlkit import stages
from rlkit.errors import StageOrderError


def test_train_before_rollout_raises_the_guard_error(session):
    assert session.batch is None
    with pytest.raises(StageOrderError, match=r"call session\.rollout\(\) before session\.train\(\)"):
        session.train()


def test_cell_by_cell(session):
    b = session.rollout()
    B, T = b.input_ids.shape
    assert B == 16 and b.group_size == 4 and b.num_prompts == 4 and len(b.rows) == 4
    assert not (b.loss_mask & ~b.attention_mask).any()  # completion tokens are real tokens
    lengths = b.attention_mask.sum(1)
    assert torch.equal(b.attention_mask, torch.arange(T)[None] < lengths[:, None])  # right-padded
    assert torch.equal(b.prompt_lengths + b.completion_lengths, lengths)
    assert (b.completion_lengths >= 1).all()
    assert (b.generator_logprobs[~b.loss_mask] == 0).all() and (b.generator_logprobs[b.loss_mask] <= 0).all()
    for i in range(0, B, 4):  # samples of one prompt share the prompt tokens
        p = int(b.prompt_lengths[i])
        assert all(torch.equal(b.input_ids[i, :p], b.input_ids[j, :p]) for j in range(i, i + 4))

    snapshot = b.input_ids.clone(), b.generator_logprobs.clone()
    b = session.score(b)
    answers = [row["answer"] for row in b.row_of_sample]
    expected = torch.tensor([float(c.strip() == a) + 0.1 * len(c) for c, a in zip(b.completions, answers)])
    assert torch.allclose(b.rewards, expected) and b.rewards.std() > 0

    b = session.advantages(b)
    assert b.advantages.shape == (B, T) and (b.advantages[~b.loss_mask] == 0).all()
    per_sample = b.advantages.sum(1) / b.completion_lengths
    assert per_sample.abs().max() > 0.1  # rewards vary, so advantages do
    groups = b.rewards.view(4, 4)
    mean, std = groups.mean(1, keepdim=True), groups.std(1, keepdim=True)
    expected_adv = torch.where(std > 0, (groups - mean) / (std + 1e-6), groups - mean).flatten()
    assert torch.allclose(per_sample, expected_adv, atol=1e-5)

    b = session.logprobs(b)
    assert b.prev_logprobs.shape == (B, T) and b.ref_logprobs is None  # KL coefficient 0: reference skipped
    assert abs(b.info["token_mult_prob_error"] - 1.0) < 1e-3
    assert (b.prev_logprobs - b.generator_logprobs)[b.loss_mask].abs().max() < 1e-3
    assert torch.equal(b.input_ids, snapshot[0]) and torch.equal(b.generator_logprobs, snapshot[1])  # not mutated

    version = session.policy.version
    m = session.train(b)
    assert session.policy.version == version + 1 and session.stale
    assert m.step == session.step_count and "train/loss" in m.values and m["train/grad_norm"] >= 0
    report = session.refit()
    assert not session.stale and report.policy_version == session.policy.version


def test_each_stage_twice_gives_equal_results(session):
    a, b = session.rollout(), session.rollout()
    assert torch.equal(a.input_ids, b.input_ids) and a.completions == b.completions
    a, b = session.score(a), session.score(a)
    assert torch.equal(a.rewards, b.rewards)
    a, b = session.advantages(a), session.advantages(a)
    assert torch.equal(a.advantages, b.advantages)
    a, b = session.logprobs(a), session.logprobs(a)
    assert torch.equal(a.prev_logprobs, b.prev_logprobs) and torch.equal(a.entropy, b.entropy)
    assert session.loss(a).metrics == session.loss(a).metrics


def test_stage_functions_guard_missing_inputs(session):
    batch = session.rollout()
    with pytest.raises(StageOrderError, match=r"no rewards yet: run score\(\)"):
        stages.advantages(batch)
    with pytest.raises(StageOrderError, match=r"no advantages yet: run advantages\(\)"):
        stages.train(session.score(batch), session.policy, session.loss_fn)


def test_mismatch_stays_within_1e3_after_every_refit(session):
    history = session.run(3, progress=False)
    assert [m.step for m in history] == list(range(session.step_count - 2, session.step_count + 1))
    for m in history:
        assert abs(m["train/token_mult_prob_error"] - 1.0) < 1e-3
        assert m["rollout/policy_lag"] == 0
        for key in ("rollout", "score", "advantages", "logprobs", "train", "refit", "step_total"):
            assert m[f"timing/{key}"] >= 0
        # throughput is wall-clock too: under timing/, so that rollout/ holds only reproducible values
        assert m["timing/samples_per_second"] == pytest.approx(16 / m["timing/step_total"])
        assert m["timing/tokens_per_second"] == pytest.approx(
            m["rollout/gen_length_mean"] * 16 / m["timing/step_total"])
        assert not [k for k in m.values if k.endswith("_per_second") and not k.startswith("timing/")]


def test_stale_generator_is_reported_and_warned(session):
    session.step()
    batch = session.advantages(session.score(session.rollout()))
    session.train(session.logprobs(batch))
    assert session.stale and "STALE" in repr(session)
    with pytest.warns(UserWarning, match="off-policy"):
        session.rollout()
    session.refit()
    assert not session.stale and "in sync" in repr(session)


def test_sft_hands_its_weights_to_the_generator(session):
    """After sft() the generator holds the fine-tuned weights, as after step(): the next rollout is on-policy."""
    session.refit()
    version = session.policy.version
    session.sft(num_steps=2, progress=False)
    assert session.policy.version == version + 2 and not session.stale
    assert session.last_refit.policy_version == session.policy.version
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        batch = session.logprobs(session.score(session.rollout()))
    assert not [w for w in caught if "off-policy" in str(w.message) or "disagree" in str(w.message)]
    assert batch.policy_version == session.policy.version and batch.info["logprob_abs_diff_max"] < 1e-3

    session.sft(num_steps=1, progress=False, refit=False)  # the policy only, as train() does
    assert session.stale and session.generator_version == version + 2
    session.refit()


def test_trainer_values_are_zero_outside_the_completion(session):
    """The padding convention of Trajectories: prev_logprobs, ref_logprobs and entropy hold 0 on prompt and
    padding positions (the policy scores every position), and the completion keeps the policy's values."""
    batch = session.score(session.rollout())
    scored = stages.logprobs(batch, session.policy, with_reference=True)
    outside = ~batch.loss_mask
    assert (batch.prompt_lengths > 1).all() and outside.any()
    raw = session.policy.logprobs(batch.input_ids, batch.attention_mask, with_entropy=True)
    assert raw.logprobs[outside & batch.attention_mask].abs().max() > 0  # what the policy gives on prompts
    for name in ("prev_logprobs", "ref_logprobs", "entropy"):
        values = getattr(scored, name)
        assert values.shape == batch.input_ids.shape and (values[outside] == 0).all(), name
    assert torch.equal(scored.prev_logprobs[batch.loss_mask], raw.logprobs[batch.loss_mask])
    assert torch.equal(scored.entropy[batch.loss_mask], raw.entropy[batch.loss_mask])


def test_reset_starts_the_run_over_with_the_same_engines(session):
    """reset(): the state a fresh Session(config) starts in, without restarting vLLM or Megatron."""
    from rlkit.errors import ConfigError
    from rlkit.policy.megatron.policy import load_hf_state

    session.step()
    generator, policy = session.generator, session.policy
    session.reset(["seed=5", "loss_fn.ratio_clip_max=0.3"])
    assert session.generator is generator and session.policy is policy  # engines kept
    assert session.config.seed == 5 and session.loss_fn.params.ratio_clip_max == 0.3
    assert session.step_count == 0 and session.history == [] and session.batch is None
    assert policy.version == 0 and not session.stale and session.last_refit.policy_version == 0
    initial = load_hf_state(session.config.policy.model_name)
    exported = {name: t for group in policy.export_hf_groups() for name, t in group}
    assert all(torch.equal(exported[name], initial[name]) for name in initial)  # weights from the model folder

    first = session.step()
    session.reset()  # the same config again: the same first step
    again = session.step()
    deterministic = lambda m: {k: v for k, v in m.values.items() if not k.startswith("timing/")}  # noqa: E731
    assert again.step == first.step == 1 and deterministic(again) == pytest.approx(deterministic(first))

    with pytest.raises(ConfigError, match=r"policy\.generation\.temperature: changing it needs a new Session"):
        session.reset(["policy.generation.temperature=0.5"])
    assert session.step_count == 1  # nothing was reset
