"""A session whose CPU engine releases its weights while the policy trains
(``policy.generation.vllm_cfg.release_weights_for_training``): steps agree with the policy after each refit, and a
rollout after ``train()`` without ``refit()`` refits first, with a warning, instead of failing on missing weights."""

import pytest
import torch

import rlkit
from tests.session.conftest import tiny_overrides

pytestmark = pytest.mark.skipif(torch.cuda.is_available(), reason="a GPU engine sleeps instead (vLLM's sleep mode)")


def test_steps_train_and_rollouts_around_a_released_engine(tmp_path):
    overrides = tiny_overrides(tmp_path, **{"policy.generation.vllm_cfg.release_weights_for_training": True})
    with rlkit.Session.from_config("quickstart", overrides) as session:
        for _ in range(2):
            metrics = session.step()
            assert abs(metrics["train/token_mult_prob_error"] - 1) < 1e-3 and not session.stale
        assert session.generator.weights_released is False  # the refit ending each step rebuilt them
        # and freed the policy's gradient buffers in turn (the next step reallocates them)
        buffers = session.policy.adapter._forward_module.buffers
        assert buffers and all(b.grad_data.untyped_storage().nbytes() == 0 for b in buffers)

        batch = session.advantages(session.score(session.rollout()))
        session.train(session.logprobs(batch))
        assert session.generator.weights_released and session.stale
        with pytest.warns(UserWarning, match="refitting before this rollout"):
            batch = session.rollout()
        assert not session.stale and batch.policy_version == session.policy.version
        batch = session.logprobs(session.score(batch))
        assert batch.info["logprob_abs_diff_max"] < 1e-3  # the rebuilt engine samples the policy's weights


def test_adapters_with_the_base_and_the_engine_released_in_turn(tmp_path):
    """Adapters with ``policy.lora_cfg.release_base_while_generating`` too: after each refit the policy holds no
    base (the engine's copy is the only one while it generates), and the steps still agree with the engine."""
    overrides = tiny_overrides(tmp_path, **{"policy.generation.vllm_cfg.release_weights_for_training": True,
                                            "policy.lora_cfg.enabled": True, "policy.lora_cfg.dim": 4,
                                            "policy.lora_cfg.release_base_while_generating": True})
    with rlkit.Session.from_config("quickstart", overrides) as session:
        policy = session.policy
        for _ in range(2):
            metrics = session.step()
            assert abs(metrics["train/token_mult_prob_error"] - 1) < 1e-3
            assert policy.adapter.frozen_base.released and not session.generator.weights_released
        base = [p for p in policy.model.parameters() if not p.requires_grad]
        assert base and all(p.untyped_storage().nbytes() == 0 for p in base)
        batch = session.logprobs(session.score(session.rollout()))  # the forward pass reads the base back
        assert batch.info["logprob_abs_diff_max"] < 1e-3 and not policy.adapter.frozen_base.released
