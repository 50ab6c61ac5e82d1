"""The padded batch from ragged generator output, against values written out by hand (right padding; the
generator's logprobs on the completion tokens only; an empty completion has no loss tokens)."""

import dataclasses

import pytest
import torch

from rlkit.generation.base import Generation
from rlkit.stages.batching import trajectories_from_generation


def test_ragged_samples_are_right_padded_with_logprobs_on_the_completion():
    samples = [((7, 8), (-0.5, -0.25), "ab", "stop"), ((), (), "", "stop"),  # prompt 0 (2 tokens)
               ((9,), (-1.0,), "c", "length"), ((4, 5, 6), (-0.1, -0.2, -0.3), "def", "length")]  # prompt 1 (1)
    batch = trajectories_from_generation(Generation.from_samples([[1, 2], [3]], samples, 2), 0, ["p0", "p1"],
                                         policy_version=4)
    assert batch.input_ids.tolist() == [[1, 2, 7, 8], [1, 2, 0, 0], [3, 9, 0, 0], [3, 4, 5, 6]]
    assert batch.attention_mask.tolist() == [[1, 1, 1, 1], [1, 1, 0, 0], [1, 1, 0, 0], [1, 1, 1, 1]]
    assert batch.loss_mask.tolist() == [[0, 0, 1, 1], [0, 0, 0, 0], [0, 1, 0, 0], [0, 1, 1, 1]]
    assert torch.equal(batch.generator_logprobs, torch.tensor(
        [[0, 0, -0.5, -0.25], [0, 0, 0, 0], [0, -1.0, 0, 0], [0, -0.1, -0.2, -0.3]], dtype=torch.float32))
    assert batch.input_ids.dtype == torch.long and batch.loss_mask.dtype == torch.bool
    assert batch.prompts == ("p0", "p0", "p1", "p1") and batch.policy_version == 4


def test_an_undecoded_generation_is_refused_with_the_call_that_decodes_it():
    samples = [((7,), (-0.5,), "", "stop")]
    undecoded = dataclasses.replace(Generation.from_samples([[1]], samples, 1), texts=None)  # as sample() returns
    with pytest.raises(ValueError, match="decode_completions"):
        trajectories_from_generation(undecoded, 0, ["p0"])
