"""A whole GRPO step through the session in bf16 (policy and generator): rollout on a bf16 vLLM engine, bf16
scores with fp32 masters, the step, and a refit from the fp32 masters into the bf16 engine, then the next step.
token_mult_prob_error measured 1.0008 (first step) and 1.0007 (after the refit), 2026-11-30; bound 1.005 for
both: bf16's own level. With a refit that loads nothing (the generator's update_weights replaced by a no-op) the
second step measured 1.011, so a refit that left the engine on other weights than the policy's fails here. Pure
bf16 (no masters: the refit sends the bf16 weights themselves) is held to the same bound."""

import pytest

import rlkit
from rlkit.envs import RewardFunctionEnvironment
from tests.session.conftest import tiny_overrides, varied_reward


@pytest.mark.parametrize("main_params_dtype", ["float32", "bfloat16"])  # fp32 masters, or pure bf16
def test_grpo_step_in_bf16_through_the_session(tmp_path, main_params_dtype):
    overrides = tiny_overrides(tmp_path, **{"policy.precision": "bfloat16",
                                            "policy.generation.vllm_cfg.precision": "bfloat16",
                                            "policy.optimizer.lr": 1e-3,
                                            "policy.optimizer.main_params_dtype": main_params_dtype})
    with rlkit.Session.from_config("quickstart", overrides, env=RewardFunctionEnvironment(varied_reward)) as s:
        assert ", bfloat16, " in repr(s.policy) and ", bfloat16, " in repr(s.generator)
        first = s.step()
        second = s.step()  # generated after the refit of the first step's update
    for record in (first, second):
        assert 1.0 < record["train/token_mult_prob_error"] < 1.005, record["train/token_mult_prob_error"]
