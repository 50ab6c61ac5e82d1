"""The plain transformers backend (``policy.hf_cfg``) in a session: the contract itself is checked in
test_contract.py; here a short GRPO session steps on it, and agrees with vLLM on the same weights."""

import torch

from rlkit.policy.hf import HFAdapter


def test_a_short_session_on_the_transformers_backend_steps(tmp_path):
    import rlkit
    from rlkit.envs import RewardFunctionEnvironment
    from tests.session.conftest import tiny_overrides, varied_reward

    overrides = tiny_overrides(tmp_path, **{"policy.hf_cfg.enabled": True, "policy.megatron_cfg.enabled": False})
    with rlkit.Session.from_config("quickstart", overrides, env=RewardFunctionEnvironment(varied_reward)) as session:
        assert isinstance(session.policy.adapter, HFAdapter) and session.policy.parallel_layout()["backend"] == "hf"
        before = session.policy.hf_state_dict()
        for step in (1, 2):
            metrics = session.step()
            assert session.policy.version == step and not session.stale
            assert abs(session.batch.info["token_mult_prob_error"] - 1.0) < 1e-3  # vLLM and the policy agree
            assert metrics["train/grad_norm"] > 0 and torch.isfinite(torch.tensor(metrics["train/loss"]))
        after = session.policy.hf_state_dict()
        assert max((after[k] - before[k]).abs().max().item() for k in before) > 1e-6  # the steps moved weights
