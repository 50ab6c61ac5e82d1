import dataclasses

import pytest
import torch

from rlkit.errors import StageOrderError
from tests.helpers import random_batch


def test_select_concat_and_groups_round_trip():
    batch = random_batch(b=8, t=12, group_size=2).with_(rewards=torch.arange(8.0), rows=tuple({"i": i} for i in range(4)))
    picked = batch.select_groups(torch.tensor([2, 0]))
    assert picked.group_size == 2 and picked.rewards.tolist() == [4.0, 5.0, 0.0, 1.0]
    assert picked.rows == ({"i": 2}, {"i": 0})
    short = dataclasses.replace(batch.select_groups(torch.tensor([1])), input_ids=batch.input_ids[2:4, :7],
                                attention_mask=batch.attention_mask[2:4, :7], loss_mask=batch.loss_mask[2:4, :7],
                                generator_logprobs=batch.generator_logprobs[2:4, :7], advantages=batch.advantages[2:4, :7])
    joined = type(batch).concat([picked, short])
    assert joined.input_ids.shape == (6, 12) and joined.rows == ({"i": 2}, {"i": 0}, {"i": 1})
    assert not joined.loss_mask[4:, 7:].any()  # padding added on the right is masked out
    assert joined.rewards.tolist() == [4.0, 5.0, 0.0, 1.0, 2.0, 3.0]


def test_require_names_the_stage_and_with_does_not_mutate():
    batch = random_batch()
    with pytest.raises(StageOrderError, match=r"no rewards yet: run score\(\) on it first"):
        batch.require("rewards", "score()")
    other = batch.with_(rewards=torch.ones(8))
    assert batch.rewards is None and other.rewards is not None
    with pytest.raises(dataclasses.FrozenInstanceError):
        batch.rewards = torch.ones(8)
