"""bench/arith_chat.py, the task of bench/vs_trl_real.py: seeded, disjoint splits and the last-number reward on both
sides' completion formats (rlkit's strings, TRL's conversational message lists). No model, no TRL."""


import pytest

from tests.bench import bench_script


@pytest.fixture(scope="module")
def arith_chat():
    return bench_script("arith_chat")


def test_splits_are_disjoint_seeded_and_correct(arith_chat):
    train, heldout = arith_chat.make_splits(2000, 200, seed=0)
    assert (len(train), len(heldout)) == (2000, 200)
    train_prompts, heldout_prompts = {r["prompt"] for r in train}, {r["prompt"] for r in heldout}
    assert len(train_prompts) == 2000 and len(heldout_prompts) == 200  # distinct within each split
    assert not train_prompts & heldout_prompts
    assert arith_chat.make_splits(2000, 200, seed=0) == (train, heldout)
    assert arith_chat.make_splits(2000, 200, seed=1)[1] != heldout
    for row in train[:50] + heldout[:50]:
        words = row["prompt"].split()  # "What is 47 + 38? Answer with just the number."
        a, op, b = int(words[2]), words[3], int(words[4].rstrip("?"))
        assert 10 <= a <= 99 and 10 <= b <= 99
        assert int(row["answer"]) == (a + b if op == "+" else a - b)


def test_reward_reads_the_last_number_of_either_format(arith_chat):
    completions = ["85", "It is 85.", "47 + 38 = 85, no wait, 84", "eighty-five", "", "-7", "7"]
    answers = ["85", "85", "85", "85", "85", "-7", "-7"]
    expected = [1.0, 1.0, 0.0, 0.0, 0.0, 1.0, 0.0]
    assert arith_chat.last_number_reward([""] * 7, completions, answers) == expected
    as_messages = [[{"role": "assistant", "content": c}] for c in completions]  # TRL's conversational format
    assert arith_chat.last_number_reward([[]] * 7, as_messages, answers, trainer_state=None) == expected
