"""The advantages stage's warning when prompt groups carry no learning signal: what it says, case by case."""

import warnings

import pytest
import torch

from rlkit.stages import advantages
from tests.helpers import random_batch

FIXES = ("grpo.use_dynamic_sampling=true", "policy.generation.temperature", "e.g. 0.7 for an instruct model",
         "grpo.num_generations_per_prompt", "sft.enabled=true")


def warning_for(rewards, group_size=4, **info):
    batch = random_batch(b=len(rewards), t=10, group_size=group_size)
    batch = batch.with_(rewards=torch.tensor(rewards, dtype=torch.float32), info=dict(batch.info, **info))
    with pytest.warns(UserWarning) as caught:
        advantages(batch)
    return str(caught[0].message)


def test_no_reward_anywhere_says_no_gradient_flows_and_names_the_fixes():
    message = warning_for([0.0] * 96)  # the researcher's step: 0 of 96 samples right
    assert message.startswith("100% of prompt groups have identical rewards: all 96 samples got reward 0")
    assert "no gradient flows this step" in message
    assert all(fix in message for fix in FIXES), message
    assert "solved" not in message


def test_a_constant_penalty_is_a_reward_never_earned_too():
    message = warning_for([-1.0] * 8)
    assert "all 8 samples got reward -1 (none earned a reward)" in message and all(f in message for f in FIXES)


def test_with_dynamic_sampling_on_it_names_its_rounds_not_turning_it_on():
    message = warning_for([0.0] * 16, **{"dynamic_sampling/tries": 4})
    assert "grpo.dynamic_sampling_max_gen_batches: its 4 found no group with varied rewards" in message
    assert "grpo.use_dynamic_sampling=true" not in message and "policy.generation.temperature" in message


def test_every_reward_full_says_the_task_is_solved():
    message = warning_for([1.0] * 16)
    assert message.startswith("100% of prompt groups have identical rewards: all 16 samples got reward 1")
    assert "no gradient flows this step" in message and "solved or too easy" in message
    assert not any(fix in message for fix in FIXES)


def test_groups_identical_but_different_from_each_other_keep_the_generic_words():
    message = warning_for([0.0] * 4 + [1.0] * 4)
    assert message == ("100% of prompt groups have identical rewards and give no gradient; the task may be too "
                       "easy or too hard for the policy")


def test_varied_groups_do_not_warn():
    batch = random_batch(b=8, t=10, group_size=4).with_(rewards=torch.tensor([0, 1, 0, 0, 1, 1, 0, 1.0]))
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        advantages(batch)
