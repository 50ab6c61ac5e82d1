"""The value models on the policy's backends against transformers' classification models on the same weights (nano
models, fp32): Megatron-Core's (rlkit.policy.megatron.value_head) and DTensor's (rlkit.policy.dtensor_value_model, FSDP2
over this one process). PPO's critic's values, one train step's metrics and the values after it within 1e-5; its export
loads in transformers' token-classification model; capture/restore is exact; reward-model training on it follows the
transformers backend's losses and writes a folder the ``reward_model`` environment scores as the model did; a backend
without a value model is refused with the fix. TP=2 and FSDP over 2 ranks: tests/policy/test_value_model_parallel.py
(slow).
"""

import pytest
import torch

from rlkit.config.components import PolicyConfig
from rlkit.config.run import CriticConfig, RewardModelConfig
from rlkit.errors import ConfigError
from tests.helpers import random_batch

TOL = 1e-5
PAIRS = [{"prompt": f"{a}+{b}=", "chosen": str(a + b), "rejected": str(a + b + 1)} for a in range(4) for b in range(3)]


def critics(path, backend, **cfg):
    """The transformers critic and the one on ``backend`` (policy.backend) with the same weights: the DTensor one is
    built as the transformers one (same seed), the Megatron one draws its head otherwise and is loaded with them."""
    from rlkit.policy.critic import Critic

    cfg = CriticConfig(enabled=True, lr=3e-3, micro_batch_size=3, **cfg)
    hf = Critic(path, cfg, seed=1)
    other = Critic(path, cfg.model_copy(update={"backend": "policy"}), seed=1,
                   policy=PolicyConfig(model_name=str(path), backend=backend))
    if backend == "megatron":
        other.value_model.load_hf_state(hf.export_hf_state())
    return hf, other


@pytest.mark.parametrize("backend", ["megatron", "dtensor"])
@pytest.mark.parametrize("tied", [False, True])
def test_the_policy_backends_critic_equals_the_transformers_critic_on_the_same_weights(model_factory, tied, backend):
    path = model_factory("nano", "qwen2" if not tied else "llama", seed=1, tie_word_embeddings=tied)
    hf, other = critics(path, backend, value_clip=0.2)
    try:
        batch = random_batch(b=7, t=20)
        ids, mask, scored = batch.input_ids, batch.attention_mask, batch.loss_mask
        v_hf, v_other = hf.values(ids, mask, scored), other.values(ids, mask, scored)
        assert v_hf[scored].abs().max() > 0.05 and (v_other - v_hf).abs().max() < TOL
        gen = torch.Generator().manual_seed(5)
        returns = torch.randn(scored.shape, generator=gen) * scored
        old = (v_hf + 0.3 * torch.randn(scored.shape, generator=gen)) * scored  # as if from an earlier step: some clip
        m_hf = hf.train_step(ids, mask, scored, old, returns)
        m_other = other.train_step(ids, mask, scored, old, returns)
        assert m_hf["critic/clip_fraction"] > 0  # the clipped branch is exercised too
        for key, value in m_hf.items():
            assert abs(m_other[key] - value) < TOL * max(1.0, abs(value)), key
        after_hf, after_other = hf.values(ids, mask, scored), other.values(ids, mask, scored)
        assert (after_hf - v_hf).abs().max() > 100 * TOL  # the step moved the values
        assert (after_other - after_hf).abs().max() < TOL
    finally:
        hf.close()
        other.close()


@pytest.mark.parametrize("backend", ["megatron", "dtensor"])
def test_the_policy_backends_critics_export_loads_in_transformers_and_its_capture_restores(model_factory, backend,
                                                                                          tmp_path):
    from transformers import AutoConfig, AutoModelForTokenClassification

    path = model_factory("nano", "qwen2", seed=1)
    hf, other = critics(path, backend)
    hf.close()
    try:
        batch = random_batch(b=4, t=16)
        ids, mask, scored = batch.input_ids, batch.attention_mask, batch.loss_mask
        before = other.values(ids, mask, scored)
        state = other.capture()
        other.save_state(tmp_path)
        for reload in (lambda: other.restore(state), lambda: other.load_state(tmp_path)):
            other.train_step(ids, mask, scored, before, torch.ones_like(before) * scored)
            assert (other.values(ids, mask, scored) - before).abs().max() > 100 * TOL
            reload()
            assert torch.equal(other.values(ids, mask, scored), before) and other.version == 0
        config = AutoConfig.from_pretrained(str(path), num_labels=1)
        model = AutoModelForTokenClassification.from_config(config).eval()
        model.load_state_dict(other.export_hf_state(), strict=True)
        with torch.no_grad():
            out = model(input_ids=ids, attention_mask=mask.long()).logits[..., 0]
        assert (torch.nn.functional.pad(out[:, :-1], (1, 0)) * scored - before).abs().max() < TOL
    finally:
        other.close()


@pytest.mark.parametrize("backend", ["megatron", "dtensor"])
def test_reward_model_training_on_the_policy_backend_follows_transformers_and_the_environment_loads_it(
        model_factory, tmp_path, backend):
    from rlkit.envs import RewardModelEnvironment
    from rlkit.policy.value_model import build_value_model
    from rlkit.stages.reward_model import (
        pair_scores,
        reward_model_tokenizer,
        save_sequence_classifier,
        train_reward_model,
        value_pair_scores,
    )

    path = model_factory("nano", "llama", seed=1)
    policy = PolicyConfig(model_name=str(path), backend=backend)
    cfg = RewardModelConfig(num_steps=3, batch_size=4, lr=1e-3)
    runs = {backend: train_reward_model(path, PAIRS, tmp_path / backend, cfg.model_copy(update={"backend": backend}),
                                        eval_pairs=PAIRS[:6], seed=2, policy=policy)
            for backend in ("transformers", "policy")}
    assert runs["transformers"].losses[0] != runs["transformers"].losses[-1]
    for a, b in zip(runs["transformers"].losses, runs["policy"].losses):
        assert abs(a - b) < TOL
    # the folder the value model writes scores as the model did
    model = build_value_model("policy", path, bias=False, seed=4, policy=policy)
    try:
        tokenizer = reward_model_tokenizer(path)
        model.module.eval()
        with torch.no_grad():
            own = torch.cat(value_pair_scores(model, tokenizer, PAIRS, None, None))
        save_sequence_classifier(model, path, tmp_path / "rm", tokenizer)
    finally:
        model.close()
    env = RewardModelEnvironment(tmp_path / "rm", batch_size=5)
    with torch.no_grad():
        loaded = torch.cat(pair_scores(env.model, env.tokenizer, PAIRS, None, None))
    assert own.abs().max() > 0.01 and (loaded - own).abs().max() < TOL


def test_a_backend_without_a_value_model_is_refused_with_the_fix(model_factory, monkeypatch):
    from rlkit.policy.value_model import POLICY_BACKEND_VALUE_MODELS, build_value_model

    monkeypatch.delitem(POLICY_BACKEND_VALUE_MODELS, "dtensor")  # (every backend has one now)
    policy = PolicyConfig(model_name=str(model_factory("nano", "llama", seed=1)), backend="dtensor")
    with pytest.raises(ConfigError, match=r"critic.backend=policy: the dtensor backend has no value model yet.*"
                                          r"Fix: critic.backend=transformers"):
        build_value_model("policy", policy.model_name, bias=True, policy=policy)


def test_the_config_refuses_a_value_model_on_a_backend_without_one_and_the_flags_match_the_registry(monkeypatch):
    from rlkit.config.backends import BACKEND_SECTIONS, DTensorConfig
    from rlkit.config.loading import load_config
    from rlkit.config.run import VALUE_BACKEND_ON_POLICY
    from rlkit.policy.value_model import POLICY_BACKEND_VALUE_MODELS, VALUE_BACKENDS

    assert {s.name for s in BACKEND_SECTIONS if s.has_value_model} == set(POLICY_BACKEND_VALUE_MODELS)
    assert set(VALUE_BACKENDS) == set(VALUE_BACKEND_ON_POLICY)
    overrides = {"critic.backend": "policy", "reward_model.backend": "policy", "policy.backend": "dtensor"}
    assert load_config("ppo", overrides).critic.backend == "policy"
    monkeypatch.setattr(DTensorConfig, "has_value_model", False)  # (every backend has one now)
    with pytest.raises(ConfigError) as refused:
        load_config("ppo", overrides)
    assert "critic.backend=policy: the dtensor backend has no value model yet. Fix: critic.backend=transformers" in str(
        refused.value) and "reward_model.backend=policy: the dtensor backend" in str(refused.value)
    assert load_config("ppo", {"critic.backend": "policy"}).critic.backend == "policy"


@pytest.mark.parametrize("backend", ["megatron", "dtensor"])
def test_a_ppo_session_trains_its_critic_on_the_policys_backend_beside_the_policy(tmp_path, backend):
    import rlkit
    from rlkit.policy.dtensor_value_model import DTensorValueModel
    from rlkit.policy.megatron.value_head import MegatronValueModel
    from tests.stages.test_ppo import NANO

    overrides = {**NANO, "sft.num_steps": 10, "policy.model_name": str(tmp_path / "model"),
                 "logger.log_dir": str(tmp_path / "runs"), "critic.backend": "policy", "policy.backend": backend}
    with rlkit.Session.from_config("ppo", overrides) as s:
        critic = s.components.critic
        assert isinstance(critic.value_model, {"megatron": MegatronValueModel, "dtensor": DTensorValueModel}[backend])
        s.sft(progress=False)
        batch = s.values(s.logprobs(s.score(s.rollout())))
        assert batch.values[batch.loss_mask].abs().sum() > 0 and not batch.values[~batch.loss_mask].any()
        metrics = s.train(s.advantages(batch))
        assert metrics.values["critic/value_loss"] > 0 and critic.version == 1
        assert "critic/value_loss" in s.step().values and critic.version == 2
