"""The DTensor/FSDP2 policy against the Megatron policy on the same weights and batch, and in a session.

Logprobs must agree within 1e-4 (the acceptance bound; they agree to ~1e-6 in fp32). One AdamW step is
compared too: the gradient norms agree to ~1e-7 relative, the weights to 1e-4 because Adam's first step
divides each gradient entry by its own magnitude, which magnifies float noise in near-zero entries.
"""

import pytest
import torch

from rlkit.config.components import OptimizerConfig, PolicyConfig
from rlkit.config.loading import load_config
from rlkit.errors import ConfigError
from rlkit.policy.dtensor import DTensorAdapter, DTensorPolicy
from rlkit.policy.megatron.policy import MegatronPolicy, load_hf_state
from tests.helpers import pg_token_mean_loss, random_batch


@pytest.fixture(scope="module")
def cfg(model_factory):
    path = model_factory("nano", "qwen2", seed=1, num_key_value_heads=2)
    return PolicyConfig(model_name=str(path), train_micro_batch_size=4, optimizer=OptimizerConfig(lr=1e-3),
                        generation={"temperature": 0.7})


def test_dtensor_matches_megatron_on_the_same_weights(cfg):
    batch = random_batch(b=8, t=24)
    megatron = MegatronPolicy(cfg)
    try:
        m_scores = megatron.logprobs(batch.input_ids, batch.attention_mask, with_entropy=True)
        m_step = megatron.train_step(batch, pg_token_mean_loss)
        m_after = megatron.hf_state_dict()
    finally:
        megatron.close()

    policy = DTensorPolicy(cfg)
    try:
        original = load_hf_state(cfg.model_name)
        exported = policy.hf_state_dict()
        assert set(exported) == set(original) and all(torch.equal(exported[k], original[k]) for k in original)

        scores = policy.logprobs(batch.input_ids, batch.attention_mask, with_entropy=True)
        assert (scores.logprobs - m_scores.logprobs).abs().max() < 1e-4
        assert (scores.entropy - m_scores.entropy).abs().max() < 1e-4
        assert (scores.logprobs[~batch.attention_mask] == 0).all()

        step = policy.train_step(batch, pg_token_mean_loss)
        assert step.version == policy.version == 1 and step.num_microbatches == 2
        assert abs(step.grad_norm - m_step.grad_norm) < 1e-5 * m_step.grad_norm
        assert abs(step.metrics["loss"] - m_step.metrics["loss"]) < 1e-5
        after = policy.hf_state_dict()
        moved = max((after[k] - original[k]).abs().max().item() for k in original)
        assert moved > 5e-4  # lr 1e-3: the step is visible at the tolerance below
        assert max((after[k] - m_after[k]).abs().max().item() for k in original) < 1e-4

        reference = policy.reference_logprobs(batch.input_ids, batch.attention_mask).logprobs
        assert (reference - m_scores.logprobs).abs().max() < 1e-4  # the reference is the pre-step weights
        assert torch.equal(policy.logprobs(batch.input_ids, batch.attention_mask).logprobs,
                           policy.logprobs(batch.input_ids, batch.attention_mask).logprobs)
        assert (policy.logprobs(batch.input_ids, batch.attention_mask).logprobs - scores.logprobs).abs().max() > 1e-4
    finally:
        policy.close()


def test_gradient_is_the_same_over_1_and_4_microbatches(cfg):
    batch = random_batch(b=8, t=24)
    policy = DTensorPolicy(cfg)
    try:
        grads = {}
        for micro in (8, 2):
            policy.cfg = cfg.model_copy(update={"train_micro_batch_size": micro})
            policy.compute_gradients(batch, pg_token_mean_loss)
            grads[micro] = {n: p.grad.full_tensor().clone() for n, p in policy.model.named_parameters()}
        assert max((grads[8][n] - grads[2][n]).abs().max().item() for n in grads[8]) < 1e-5
    finally:
        policy.close()


def test_backend_selection_is_validated(tmp_path):
    base = {"policy.model_name": str(tmp_path / "m"), "policy.model_preset": "nano", "sft.enabled": False}
    config = load_config("quickstart", dict(base, **{"policy.backend": "dtensor"}))
    assert config.policy.backend_section is config.policy.dtensor_cfg
    nemo_rl = load_config("quickstart", dict(base, **{"policy.dtensor_cfg.enabled": True,
                                                      "policy.megatron_cfg.enabled": False}))
    assert nemo_rl == config
    with pytest.raises(ConfigError, match="choose different training backends"):
        load_config("quickstart", dict(base, **{"policy.backend": "megatron", "policy.dtensor_cfg.enabled": True}))


def test_grpo_step_through_the_session_on_dtensor(tmp_path):
    import rlkit
    from rlkit.envs import RewardFunctionEnvironment
    from tests.session.conftest import tiny_overrides, varied_reward

    overrides = tiny_overrides(tmp_path, **{"policy.dtensor_cfg.enabled": True, "policy.megatron_cfg.enabled": False})
    session = rlkit.Session.from_config("quickstart", overrides, env=RewardFunctionEnvironment(varied_reward))
    try:
        assert isinstance(session.policy.adapter, DTensorAdapter)
        metrics = session.step()
        assert session.policy.version == 1 and not session.stale
        assert abs(session.batch.info["token_mult_prob_error"] - 1.0) < 1e-3  # vLLM and the policy agree
        assert metrics["train/grad_norm"] > 0
        session.reset()  # a sweep's next run on the same engines (no Megatron state in this process to seed)
        assert session.policy.version == 0 and session.step_count == 0 and not session.stale
    finally:
        session.close()
