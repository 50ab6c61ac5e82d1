"""PPO with a value model on the nano task: the config refuses GAE without a critic (and a critic without GAE), a
step fills the batch's values and trains the critic, the advantages are GAE over those values, the stages refuse
the wrong order, and the critic fits fixed returns."""

import pytest
import torch

import rlkit
from rlkit.algorithms import compute_advantages
from rlkit.algorithms.returns import gae
from rlkit.config.loading import load_config
from rlkit.errors import ConfigError

NANO = {"policy.model_preset": "nano", "data.digits": 1, "data.num_train": 200, "data.num_validation": 16,
        "eval.num_prompts": 16, "sft.num_steps": 60, "sft.batch_size": 32, "policy.max_total_sequence_length": 28,
        "policy.generation.max_new_tokens": 8, "grpo.num_prompts_per_step": 4, "grpo.num_generations_per_prompt": 4}


def test_gae_and_the_critic_go_together():
    with pytest.raises(ConfigError, match="advantage_estimator=gae and critic.enabled go together"):
        load_config("quickstart_nano", {"grpo.advantage_estimator": "gae"})
    with pytest.raises(ConfigError, match="go together"):
        load_config("quickstart_nano", {"critic.enabled": True})
    assert load_config("ppo").critic.enabled


def test_a_ppo_step_uses_gae_over_the_critics_values_and_trains_it(tmp_path):
    overrides = {**NANO, "policy.model_name": str(tmp_path / "model"), "logger.log_dir": str(tmp_path / "runs")}
    with rlkit.Session.from_config("ppo", overrides) as s:
        s.sft(progress=False)
        batch = s.logprobs(s.score(s.rollout()))
        with pytest.raises(ValueError, match="run the values stage"):
            s.advantages(batch)
        batch = s.advantages(s.values(batch))
        assert batch.values.shape == batch.loss_mask.shape and batch.values[batch.loss_mask].abs().sum() > 0
        assert not batch.values[~batch.loss_mask].any()
        params = s.config.grpo.advantage_params()
        expected = compute_advantages("gae", batch.rewards, batch.loss_mask, batch.group_size, params,
                                      values=batch.values)
        assert torch.allclose(batch.advantages, expected, atol=1e-6)
        metrics = s.train(batch)
        assert {"critic/value_loss", "critic/clip_fraction", "critic/grad_norm"} <= set(metrics.values)
        assert s.components.critic.version == 1
        after = s.step()  # the loop: values before advantages, the critic after the policy
        assert s.components.critic.version == 2 and after.values["critic/value_loss"] > 0


def test_the_critic_fits_fixed_returns(tmp_path, model_factory):
    from rlkit.config.run import CriticConfig
    from rlkit.policy.critic import Critic
    from tests.helpers import random_batch

    critic = Critic(model_factory("nano", "llama", seed=1), CriticConfig(enabled=True, lr=3e-3, micro_batch_size=3))
    batch = random_batch(b=6, t=12, seed=4)
    mask = batch.loss_mask
    rewards = torch.zeros(mask.shape)
    rewards[torch.arange(6), mask.long().cumsum(1).argmax(1)] = torch.tensor([1.0, 0, 1, 0, 0, 1])
    losses = []
    for _ in range(30):
        old = critic.values(batch.input_ids, batch.attention_mask, mask)
        _, returns = gae(rewards, old, mask, 1.0, 0.95)
        losses.append(critic.train_step(batch.input_ids, batch.attention_mask, mask, old, returns)["critic/value_loss"])
    assert losses[-1] < 0.5 * losses[0], losses[::5]


def test_configure_switches_grpo_to_ppo_and_back(tmp_path):
    overrides = {**NANO, "sft.enabled": False, "policy.model_name": str(tmp_path / "model"),
                 "logger.log_dir": str(tmp_path / "runs")}
    with rlkit.Session.from_config("quickstart_nano", overrides) as s:
        s.step()
        with pytest.raises(ConfigError, match="go together"):  # refused whole: nothing built
            s.configure(["critic.enabled=true"])
        assert s.components.critic is None and not s.config.critic.enabled
        s.configure(["critic.enabled=true", "grpo.advantage_estimator=gae"])
        assert s.components.critic is not None
        assert "critic/value_loss" in s.step().values and s.batch.values is not None
        critic = s.components.critic
        s.configure(["critic.lr=5e-4", "critic.value_clip=0.2"])  # read by the next critic call: the same critic
        s.step()
        assert s.components.critic is critic and critic.optimizer.param_groups[0]["lr"] == 5e-4
        assert critic.cfg.value_clip == 0.2
        s.configure(["critic.enabled=false", "grpo.advantage_estimator=grpo"])
        assert s.components.critic is None and "critic/value_loss" not in s.step().values


def test_a_checkpoint_holds_the_critic_and_resumes_it_exactly(tmp_path):
    """save() writes the critic's weights, Adam state and step count beside the policy; Session.load() puts them back,
    so the resumed run's next critic step is the one the saved run takes (before, a resumed run got a fresh critic)."""
    overrides = {**NANO, "sft.enabled": False, "policy.model_name": str(tmp_path / "model"),
                 "logger.log_dir": str(tmp_path / "runs"), "critic.enabled": True, "grpo.advantage_estimator": "gae",
                 "critic.lr": 1e-3}
    with rlkit.Session.from_config("quickstart_nano", overrides) as s:
        s.step()
        s.step()
        s.save(tmp_path / "ckpt")
        critic = s.components.critic
        saved = {n: p.detach().clone() for n, p in critic.model.named_parameters()}
        assert critic.version == 2 and critic.optimizer.state  # Adam has moments to keep
        next_values = s.step().values
    with rlkit.Session.load(tmp_path / "ckpt") as resumed:
        critic = resumed.components.critic
        assert critic.version == 2
        assert all(torch.equal(p, saved[n]) for n, p in critic.model.named_parameters())
        again = resumed.step().values
    for key in ("critic/value_loss", "critic/grad_norm", "critic/explained_variance"):
        assert again[key] == pytest.approx(next_values[key], abs=1e-6), key


def test_each_fork_branch_keeps_its_own_critic(tmp_path):
    """Branches forked from one state take the same first step, critic included (same weights, Adam state, RNG):
    with one shared critic, the second branch's step would start from the critic the first branch just trained.
    Afterwards each branch's critic has taken its own steps, and a parked branch counts its critic's bytes."""
    overrides = {**NANO, "sft.enabled": False, "policy.model_name": str(tmp_path / "model"),
                 "logger.log_dir": str(tmp_path / "runs"), "critic.enabled": True, "grpo.advantage_estimator": "gae",
                 "critic.lr": 1e-3}
    with rlkit.Session.from_config("quickstart_nano", overrides) as s:
        s.step()
        a, b = s.fork(2)
        first_a, first_b = a.step().values, b.step().values
        for key in ("critic/value_loss", "critic/grad_norm", "critic/explained_variance", "train/loss"):
            assert first_b[key] == first_a[key], key
        a.step()
        assert a.components.critic.version == 3 and b.components.critic.version == 2
        critic_bytes = sum(p.numel() * 4 * 3 for p in s.components.critic.model.parameters())  # weights + 2 moments
        assert a.nbytes >= critic_bytes  # a is parked now (b is active): its critic copy is in its bytes
