"""The value model on Megatron-Core (rlkit.policy.megatron.value_head) against transformers' classification models on
the same weights (nano models, fp32): PPO's critic's values, one train step's metrics and the values after it within
1e-5; its export loads in transformers' token-classification model; capture/restore is exact; reward-model training on
it follows the transformers backend's losses and writes a folder the ``reward_model`` environment scores as the model
did; a backend without a value model is refused with the fix. TP=2: tests/policy/test_value_model_parallel.py (slow).
"""

import pytest
import torch

from rlkit.config.components import PolicyConfig
from rlkit.config.run import CriticConfig, RewardModelConfig
from rlkit.errors import ConfigError
from tests.helpers import random_batch

TOL = 1e-5
PAIRS = [{"prompt": f"{a}+{b}=", "chosen": str(a + b), "rejected": str(a + b + 1)} for a in range(4) for b in range(3)]


def critics(path, **cfg):
    """The transformers critic and the Megatron one, the latter loaded with the former's weights (head included)."""
    from rlkit.policy.critic import Critic

    cfg = CriticConfig(enabled=True, lr=3e-3, micro_batch_size=3, **cfg)
    hf = Critic(path, cfg, seed=1)
    megatron = Critic(path, cfg.model_copy(update={"backend": "policy"}), seed=1,
                      policy=PolicyConfig(model_name=str(path)))
    megatron.value_model.load_hf_state(hf.export_hf_state())
    return hf, megatron


@pytest.mark.parametrize("tied", [False, True])
def test_the_megatron_critic_equals_the_transformers_critic_on_the_same_weights(model_factory, tied):
    path = model_factory("nano", "qwen2" if not tied else "llama", seed=1, tie_word_embeddings=tied)
    hf, megatron = critics(path, value_clip=0.2)
    try:
        batch = random_batch(b=7, t=20)
        ids, mask, scored = batch.input_ids, batch.attention_mask, batch.loss_mask
        v_hf, v_mg = hf.values(ids, mask, scored), megatron.values(ids, mask, scored)
        assert v_hf[scored].abs().max() > 0.05 and (v_mg - v_hf).abs().max() < TOL
        gen = torch.Generator().manual_seed(5)
        returns = torch.randn(scored.shape, generator=gen) * scored
        old = (v_hf + 0.3 * torch.randn(scored.shape, generator=gen)) * scored  # as if from an earlier step: some clip
        m_hf = hf.train_step(ids, mask, scored, old, returns)
        m_mg = megatron.train_step(ids, mask, scored, old, returns)
        assert m_hf["critic/clip_fraction"] > 0  # the clipped branch is exercised too
        for key, value in m_hf.items():
            assert abs(m_mg[key] - value) < TOL * max(1.0, abs(value)), key
        after_hf, after_mg = hf.values(ids, mask, scored), megatron.values(ids, mask, scored)
        assert (after_hf - v_hf).abs().max() > 100 * TOL  # the step moved the values
        assert (after_mg - after_hf).abs().max() < TOL
    finally:
        hf.close()
        megatron.close()


def test_the_megatron_critics_export_loads_in_transformers_and_its_capture_restores(model_factory):
    from transformers import AutoConfig, AutoModelForTokenClassification

    path = model_factory("nano", "qwen2", seed=1)
    hf, megatron = critics(path)
    hf.close()
    try:
        batch = random_batch(b=4, t=16)
        ids, mask, scored = batch.input_ids, batch.attention_mask, batch.loss_mask
        before = megatron.values(ids, mask, scored)
        state = megatron.capture()
        megatron.train_step(ids, mask, scored, before, torch.ones_like(before) * scored)
        assert (megatron.values(ids, mask, scored) - before).abs().max() > 100 * TOL
        megatron.restore(state)
        assert torch.equal(megatron.values(ids, mask, scored), before) and megatron.version == 0
        config = AutoConfig.from_pretrained(str(path), num_labels=1)
        model = AutoModelForTokenClassification.from_config(config).eval()
        model.load_state_dict(megatron.export_hf_state(), strict=True)
        with torch.no_grad():
            out = model(input_ids=ids, attention_mask=mask.long()).logits[..., 0]
        assert (torch.nn.functional.pad(out[:, :-1], (1, 0)) * scored - before).abs().max() < TOL
    finally:
        megatron.close()


def test_reward_model_training_on_megatron_follows_transformers_and_the_environment_loads_it(model_factory, tmp_path):
    from rlkit.envs import RewardModelEnvironment
    from rlkit.policy.megatron.value_head import MegatronValueModel
    from rlkit.stages.reward_model import (
        pair_scores,
        reward_model_tokenizer,
        save_sequence_classifier,
        train_reward_model,
        value_pair_scores,
    )

    path = model_factory("nano", "llama", seed=1)
    policy = PolicyConfig(model_name=str(path))
    cfg = RewardModelConfig(num_steps=3, batch_size=4, lr=1e-3)
    runs = {backend: train_reward_model(path, PAIRS, tmp_path / backend, cfg.model_copy(update={"backend": backend}),
                                        eval_pairs=PAIRS[:6], seed=2, policy=policy)
            for backend in ("transformers", "policy")}
    assert runs["transformers"].losses[0] != runs["transformers"].losses[-1]
    for a, b in zip(runs["transformers"].losses, runs["policy"].losses):
        assert abs(a - b) < TOL
    # the folder the Megatron value model writes scores as the model did
    model = MegatronValueModel(policy, str(path), bias=False, seed=4)
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


def test_a_backend_without_a_value_model_is_refused_with_the_fix(model_factory):
    from rlkit.policy.value_model import build_value_model

    policy = PolicyConfig(model_name=str(model_factory("nano", "llama", seed=1)), backend="dtensor")
    with pytest.raises(ConfigError, match=r"critic.backend=policy: the dtensor backend has no value model yet.*"
                                          r"Fix: critic.backend=transformers"):
        build_value_model("policy", policy.model_name, bias=True, policy=policy)


def test_the_config_refuses_a_value_model_on_a_backend_without_one_and_the_flags_match_the_registry():
    from rlkit.config.backends import BACKEND_SECTIONS
    from rlkit.config.loading import load_config
    from rlkit.config.run import VALUE_BACKEND_ON_POLICY
    from rlkit.policy.value_model import POLICY_BACKEND_VALUE_MODELS, VALUE_BACKENDS

    assert {s.name for s in BACKEND_SECTIONS if s.has_value_model} == set(POLICY_BACKEND_VALUE_MODELS)
    assert set(VALUE_BACKENDS) == set(VALUE_BACKEND_ON_POLICY)
    with pytest.raises(ConfigError) as refused:
        load_config("ppo", {"critic.backend": "policy", "reward_model.backend": "policy", "policy.backend": "dtensor"})
    assert "critic.backend=policy: the dtensor backend has no value model yet. Fix: critic.backend=transformers" in str(
        refused.value) and "reward_model.backend=policy: the dtensor backend" in str(refused.value)
    assert load_config("ppo", {"critic.backend": "policy"}).critic.backend == "policy"


def test_a_ppo_session_trains_its_critic_on_megatron_beside_the_megatron_policy(tmp_path):
    import rlkit
    from rlkit.policy.megatron.value_head import MegatronValueModel
    from tests.stages.test_ppo import NANO

    overrides = {**NANO, "sft.num_steps": 10, "policy.model_name": str(tmp_path / "model"),
                 "logger.log_dir": str(tmp_path / "runs"), "critic.backend": "policy"}
    with rlkit.Session.from_config("ppo", overrides) as s:
        critic = s.components.critic
        assert isinstance(critic.value_model, MegatronValueModel)
        s.sft(progress=False)
        batch = s.values(s.logprobs(s.score(s.rollout())))
        assert batch.values[batch.loss_mask].abs().sum() > 0 and not batch.values[~batch.loss_mask].any()
        metrics = s.train(s.advantages(batch))
        assert metrics.values["critic/value_loss"] > 0 and critic.version == 1
        assert "critic/value_loss" in s.step().values and critic.version == 2
