import pytest

import rlkit


def tiny_overrides(tmp_path, **extra):
    """A small, fast session config: nano model made in tmp_path, 4 prompts x 4 samples, no SFT."""
    values = {
        "policy.model_name": str(tmp_path / "model"),
        "policy.model_preset": "nano",
        "policy.train_micro_batch_size": 8,
        "policy.logprob_batch_size": 16,
        "grpo.num_prompts_per_step": 4,
        "grpo.num_generations_per_prompt": 4,
        "sft.enabled": False,
        "grpo.use_dynamic_sampling": False,
        "data.num_train": 200,
        "data.num_validation": 16,
        "eval.num_prompts": 16,
        "logger.log_dir": str(tmp_path / "runs"),
    }
    values.update(extra)
    return values


def varied_reward(prompts, completions, answer, **columns):
    """Exact match plus a length bonus, so an untrained model's rewards differ within a group."""
    return [float(c.strip() == a) + 0.1 * len(c) for c, a in zip(completions, answer)]


@pytest.fixture(scope="module")
def session(tmp_path_factory):
    from rlkit.envs import RewardFunctionEnvironment

    s = rlkit.Session.from_config("quickstart", tiny_overrides(tmp_path_factory.mktemp("session")),
                                  env=RewardFunctionEnvironment(varied_reward))
    yield s
    s.close()
