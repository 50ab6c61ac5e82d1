import torch

from rlkit.stages import dynamic_sampling
from tests.helpers import random_batch


def scored(rewards):
    return random_batch(b=len(rewards), t=10, group_size=2).with_(rewards=torch.tensor(rewards, dtype=torch.float32))


def test_keeps_only_groups_with_reward_variance_until_full():
    rounds = [scored([1, 1, 0, 1, 0, 0, 1, 0]), scored([0, 1, 1, 1, 0, 0, 0, 0]), scored([1, 0, 0, 1, 1, 0, 0, 1])]
    out = dynamic_sampling(lambda attempt: rounds[attempt], num_prompts=3, max_tries=5)
    assert out.rewards.view(-1, 2).tolist() == [[0, 1], [1, 0], [0, 1]]
    assert out.info["dynamic_sampling/tries"] == 2 and out.info["dynamic_sampling/shortfall"] == 0
    assert out.info["dynamic_sampling/dropped_groups"] == 2 + 3


def test_bounded_tries_report_the_shortfall():
    out = dynamic_sampling(lambda attempt: scored([1, 1, 0, 0, 1, 0, 1, 1]), num_prompts=4, max_tries=2)
    assert out.info["dynamic_sampling/tries"] == 2 and out.info["dynamic_sampling/kept_groups"] == 2
    assert out.info["dynamic_sampling/shortfall"] == 2 and out.batch_size == 4


def test_reports_the_reward_over_everything_sampled_and_the_kept_share():
    """The kept groups' mean is selected for variance; the learning curve is the mean over every round's samples."""
    rounds = [scored([1, 1, 0, 1, 0, 0, 1, 0]), scored([0, 1, 1, 1, 0, 0, 0, 0]), scored([1, 0, 0, 1, 1, 0, 0, 1])]
    out = dynamic_sampling(lambda attempt: rounds[attempt], num_prompts=3, max_tries=5)
    assert out.rewards.mean().item() == 0.5  # the kept groups: (0,1) (1,0) (0,1)
    assert out.info["rollout/reward_mean_all_sampled"] == (4 + 3) / 16  # rounds 0 and 1, kept and dropped
    assert out.info["dynamic_sampling/sampled_groups"] == 8 and out.info["dynamic_sampling/kept_fraction"] == 3 / 8


def test_all_dropped_still_reports_what_was_sampled():
    out = dynamic_sampling(lambda attempt: scored([1, 1, 1, 1, 0, 0, 1, 1]), num_prompts=4, max_tries=3)
    assert out.info["rollout/reward_mean_all_sampled"] == 0.75 and out.info["dynamic_sampling/kept_fraction"] == 0.0
    assert out.info["dynamic_sampling/sampled_groups"] == 12
