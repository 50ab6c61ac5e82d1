"""The sampler's order is a function of (seed, epoch, position) only, so a resumed run draws the same prompts."""

import json

import pytest
from datasets import Dataset

from rlkit.data import PromptSampler

ROWS = [{"prompt": f"p{i}", "answer": str(i)} for i in range(10)]


def test_each_epoch_is_a_fresh_permutation_and_batches_straddle_epochs():
    s = PromptSampler(ROWS, batch_size=4, seed=0)
    drawn = [i for _ in range(15) for i in s.next_indices()]  # 60 indices = 6 epochs
    epochs = [drawn[k : k + 10] for k in range(0, 60, 10)]
    assert all(sorted(e) == list(range(10)) for e in epochs)
    assert len({tuple(e) for e in epochs}) == 6  # reshuffled every epoch
    assert (s.epoch, s.position) == (6, 0)


def test_same_seed_same_batches_other_seed_different():
    a, b, c = (PromptSampler(ROWS, 3, seed) for seed in (5, 5, 6))
    batches_a = [a.next_batch() for _ in range(8)]
    assert batches_a == [b.next_batch() for _ in range(8)]
    assert batches_a != [c.next_batch() for _ in range(8)]
    assert all(len(batch) == 3 for batch in batches_a)


@pytest.mark.parametrize("as_dataset", [False, True])
def test_resume_continues_with_exactly_the_same_prompts(as_dataset):
    data = Dataset.from_list(ROWS) if as_dataset else ROWS
    full = PromptSampler(data, batch_size=4, seed=11)
    first = [full.next_batch() for _ in range(3)]  # 12 rows: already into epoch 1
    state = json.loads(json.dumps(full.state_dict()))  # survives a checkpoint file
    rest = [full.next_batch() for _ in range(5)]
    resumed = PromptSampler(data, batch_size=4, seed=0)  # the seed comes from the state
    resumed.load_state_dict(state)
    assert state == {"epoch": 1, "position": 2, "seed": 11, "num_rows": 10}
    assert [resumed.next_batch() for _ in range(5)] == rest
    assert first[0] != rest[0]


def test_rows_are_copies_and_bad_states_are_rejected():
    s = PromptSampler(ROWS, batch_size=12, seed=0)  # larger than the dataset: spans epochs
    batch = s.next_batch()
    assert len(batch) == 12
    batch[0]["prompt"] = "edited"
    assert all(r["prompt"] != "edited" for r in ROWS)
    with pytest.raises(ValueError, match="saved over 7 rows but the dataset has 10"):
        s.load_state_dict({"epoch": 0, "position": 0, "seed": 0, "num_rows": 7})
    with pytest.raises(ValueError, match="position"):
        s.load_state_dict({"epoch": 0, "position": 10, "seed": 0, "num_rows": 10})
    with pytest.raises(ValueError, match="non-empty"):
        PromptSampler([], batch_size=1)
