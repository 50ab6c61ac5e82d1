"""A shortened quickstart: SFT warm start, then GRPO; the reward must go up.

Single-digit addition with the nano model so it fits the default suite (~1 minute on 2 cores). 16 prompts a step:
with 8, the mean reward of 15 steps swung with which prompts they drew, and one trajectory (seed 42; and CI's, with
other rounding) rose only 0.035 in 60 steps. With 16 (measured 2026-12-07, seeds 1, 42, 7): +0.117, +0.136, +0.143. The full
quickstart (3-digit addition, 500 held-out prompts) is the README's main job; its figures are in summary.json.
"""

import rlkit
from tests.session.conftest import tiny_overrides


def test_grpo_raises_reward_after_sft(tmp_path):
    overrides = tiny_overrides(tmp_path, **{
        "data.digits": 1, "data.num_train": 500, "data.num_validation": 20, "eval.num_prompts": 20,
        "sft.enabled": True, "sft.num_steps": 200, "sft.batch_size": 32,
        "policy.optimizer.lr": 5e-4, "policy.scheduler.warmup_steps": 0,
        "grpo.num_prompts_per_step": 16, "grpo.num_generations_per_prompt": 8,
        "policy.train_micro_batch_size": 128, "policy.max_total_sequence_length": 24,
        "policy.generation.max_new_tokens": 4,
    })
    with rlkit.Session.from_config("quickstart", overrides) as session:
        session.sft(progress=False)
        history = session.run(60, progress=False)
    rewards = [m["rollout/reward_mean"] for m in history]
    first, last = sum(rewards[:15]) / 15, sum(rewards[-15:]) / 15
    assert last > first + 0.08, (first, last)
