"""Every shipped algorithm preset runs a few steps; switching is one config key, nothing else changes."""

import math

import pytest

import rlkit
from rlkit.config.loading import load_config
from rlkit.errors import ConfigError
from tests.session.conftest import tiny_overrides, varied_reward

PRESETS = ["grpo", "dr_grpo", "dapo", "gspo", "rloo", "reinforce_pp"]


@pytest.fixture(scope="module")
def shared(tmp_path_factory):
    from rlkit.envs import RewardFunctionEnvironment

    overrides = tiny_overrides(tmp_path_factory.mktemp("presets"))
    del overrides["grpo.use_dynamic_sampling"]  # each preset keeps its own setting (dapo turns it on)
    s = rlkit.Session.from_config("quickstart", overrides, env=RewardFunctionEnvironment(varied_reward))
    yield s, overrides
    s.close()


@pytest.mark.parametrize("preset", PRESETS)
def test_preset_runs_a_few_steps(shared, preset):
    session, overrides = shared
    config = load_config(preset, overrides)
    session.configure(config)
    assert session.loss_fn.params == config.loss_fn
    history = session.run(2, progress=False)
    assert len(history) == 2
    for m in history:
        assert math.isfinite(m["train/loss"]) and math.isfinite(m["train/grad_norm"])
        assert abs(m["train/token_mult_prob_error"] - 1) < 1e-3
    if preset == "dapo":
        info = session.batch.info
        assert info["dynamic_sampling/tries"] >= 1 and "dynamic_sampling/dropped_groups" in info
    if preset == "reinforce_pp":
        assert session.batch.ref_logprobs is not None  # KL in the reward needs the reference


def test_switching_the_loss_is_one_key(shared):
    session, _ = shared
    before = session.config
    assert session.configure(["loss_fn.policy_loss=cispo"]) is None  # a cell ending in it shows only the changes
    after = session.config
    changed = {k for k in before.model_fields if getattr(before, k) != getattr(after, k)}
    assert changed == {"loss_fn"} and after.loss_fn.policy_loss == "cispo"
    assert session.loss(session.advantages(session.logprobs(session.score(session.rollout())))).metrics
    with pytest.raises(ConfigError, match=r"policy\.generation\.temperature: changing it needs a new Session"):
        session.configure(["policy.generation.temperature=0.5"])


def test_several_optimizer_steps_per_rollout(shared):
    """PPO epochs x minibatches: 2 epochs over 16 samples in minibatches of 8 = 4 optimizer steps, each
    against the stored old logprobs (ratios move away from 1 after the first step)."""
    session, _ = shared
    session.configure(load_config("grpo", shared[1]))
    batch = session.advantages(session.logprobs(session.score(session.rollout())))
    from rlkit import stages

    version = session.policy.version
    result = stages.train(batch, session.policy, session.loss_fn, stages.TrainSettings(2, global_batch_size=8))
    assert len(result.steps) == 4 and session.policy.version == version + 4
    ratios = [s.metrics["probs_ratio"] for s in result.steps]
    assert ratios[0] == pytest.approx(1.0, abs=1e-5) and max(abs(r - 1) for r in ratios[1:]) > 1e-6
