"""The reward-function adapter contains per-sample failures and raises on programming errors."""

import math

import pytest

from rlkit.envs import RewardFunctionEnvironment
from rlkit.errors import RewardError


def _conv(prompt, completion):
    return [{"role": "user", "content": prompt}, {"role": "assistant", "content": completion}]


ROWS = [{"prompt": "1+1", "answer": "2", "level": 1}, {"prompt": "2+2", "answer": "4", "level": 2},
        {"prompt": "3+3", "answer": "6", "level": 3}]


def test_trl_style_call_and_values():
    seen = {}

    def exact(prompts, completions, answer, level):
        seen.update(prompts=prompts, completions=completions, answer=answer, level=level)
        return [float(c.strip() == a) for c, a in zip(completions, answer)]

    env = RewardFunctionEnvironment(exact)
    out = env.step([_conv("1+1", " 2"), _conv("2+2", "5"), _conv("3+3", "6\n")], ROWS)
    assert out.rewards.tolist() == [1.0, 0.0, 1.0]
    assert out.done.tolist() == [True] * 3 and out.observations == [None] * 3 and out.errors == []
    # Row fields arrive as lists; "prompt" is not passed as a column (TRL leaves it out too).
    assert seen == {"prompts": ["1+1", "2+2", "3+3"], "completions": [" 2", "5", "6\n"],
                    "answer": ["2", "4", "6"], "level": [1, 2, 3]}
    assert env.name == "exact" and repr(env) == "RewardFunctionEnvironment(fn='exact')"


def test_raising_function_is_isolated_to_the_failing_sample():
    calls = []

    def parse_int(prompts, completions, **_):
        calls.append(len(completions))
        return [float(int(c)) for c in completions]

    out = RewardFunctionEnvironment(parse_int).step([_conv("a", "3"), _conv("b", "x"), _conv("c", "5")], ROWS)
    assert calls == [3, 1, 2, 1, 1]  # the batch, then halves until the failing sample is alone
    assert out.rewards.tolist() == [3.0, 0.0, 5.0]
    assert len(out.errors) == 1
    assert out.errors[0].startswith("parse_int: sample 1: ValueError: invalid literal")
    assert [m["isolated"] for m in out.metadata] == [True] * 3


def test_nan_inf_and_non_numbers_give_zero_and_one_error_each():
    values = [math.nan, 0.5, math.inf, "1.0", None]
    env = RewardFunctionEnvironment(lambda prompts, completions, **_: values, name="bad_values")
    rows = [{"answer": str(i)} for i in range(5)]
    out = env.step([_conv("p", "c")] * 5, rows)
    assert out.rewards.tolist() == [0.0, 0.5, 0.0, 0.0, 0.0]
    assert [e.split(":")[1].strip() for e in out.errors] == ["sample 0", "sample 2", "sample 3", "sample 4"]
    assert "not finite: nan" in out.errors[0] and "not a number: '1.0'" in out.errors[2]
    assert out.metadata[0] == {"isolated": False}


def test_wrong_length_is_a_reward_error_naming_function_and_lengths():
    def too_short(prompts, completions, **_):
        return [1.0] * (len(completions) - 1)

    with pytest.raises(RewardError, match=r"'too_short' returned 2 rewards for 3 completions"):
        RewardFunctionEnvironment(too_short).step([_conv("p", "c")] * 3, ROWS)
    with pytest.raises(RewardError, match=r"'scalar' returned float, expected a list of 3"):
        RewardFunctionEnvironment(lambda p, c, **_: 1.0, name="scalar").step([_conv("p", "c")] * 3, ROWS)


def test_wrong_length_in_the_per_sample_fallback_also_raises():
    def broken(prompts, completions, **_):
        if len(completions) > 1:
            raise RuntimeError("batch path broken")
        return []

    with pytest.raises(RewardError, match="returned 0 rewards for 1 completions"):
        RewardFunctionEnvironment(broken).step([_conv("p", "c")] * 2, ROWS[:2])


def test_rows_with_different_fields_and_empty_batch():
    env = RewardFunctionEnvironment(lambda p, c, answer, extra: [0.0 if e is None else 1.0 for e in extra])
    out = env.step([_conv("p", "c")] * 2, [{"answer": "1"}, {"answer": "2", "extra": "x"}])
    assert out.rewards.tolist() == [0.0, 1.0]
    assert len(env.step([], [])) == 0
    with pytest.raises(TypeError, match="callable"):
        RewardFunctionEnvironment("not a function")


def test_a_dict_of_rewards_is_refused_not_read_as_its_keys():
    def by_completion(prompts, completions, **_):
        return {c: float(len(c)) for c in completions}

    with pytest.raises(RewardError) as info:
        RewardFunctionEnvironment(by_completion).step([_conv("p", c) for c in ("a", "bb", "ccc")], ROWS)
    assert str(info.value) == (
        "reward function 'by_completion' returned a dict (keys ['a', 'bb', 'ccc']), expected a list of 3 floats in "
        "the order of the completions; a dict's length and iteration are its keys, which would be read as rewards. "
        "Fix: return a list, e.g. [scores[c] for c in completions]")


def test_a_reward_that_fails_once_is_not_called_once_per_sample():
    """A flaky reward (one failure, e.g. a judge's timeout) over 16 samples: 3 calls (the batch, two halves),
    not 17 (the batch and each sample alone); one sample that always fails: 1 + 2 log2(16) = 9 calls."""
    calls = []

    def flaky(prompts, completions, **_):
        calls.append(len(completions))
        if len(calls) == 1:
            raise TimeoutError("judge timed out")
        return [1.0] * len(completions)

    rows = [{"answer": str(i)} for i in range(16)]
    out = RewardFunctionEnvironment(flaky).step([_conv("p", str(i)) for i in range(16)], rows)
    assert calls == [16, 8, 8] and out.rewards.tolist() == [1.0] * 16 and out.errors == []

    calls.clear()

    def one_bad(prompts, completions, **_):
        calls.append(len(completions))
        return [float(int(c)) for c in completions]

    completions = [str(i) for i in range(16)]
    completions[11] = "x"
    out = RewardFunctionEnvironment(one_bad).step([_conv("p", c) for c in completions], rows)
    assert calls == [16, 8, 8, 4, 2, 2, 1, 1, 4]  # depth first: [8:16] -> [8:12] -> [10:12] -> 10, 11; then [12:16]
    assert out.rewards.tolist() == [float(i) if i != 11 else 0.0 for i in range(16)]
    assert len(out.errors) == 1 and out.errors[0].startswith("one_bad: sample 11: ValueError")


def test_a_reward_with_the_wrong_signature_names_the_signature_not_the_failure_fraction():
    def first_digit(completions):  # a user's first try: no prompts, no **columns
        return [float(c[:1] == "2") for c in completions]

    env = RewardFunctionEnvironment(first_digit)
    with pytest.raises(RewardError) as err:
        env.step([_conv("1+1", "2")], ROWS[:1])
    message = str(err.value)
    assert "first_digit(completions)" in message and "def first_digit(prompts, completions, **columns)" in message
    assert "max_reward_failure_fraction" not in message


def test_a_reward_taking_only_some_columns_gets_the_signature_fix():
    env = RewardFunctionEnvironment(lambda prompts, completions, answer: [1.0] * len(completions), name="f")
    with pytest.raises(RewardError, match=r"columns \['answer', 'level'\].*level"):
        env.step([_conv("1+1", "2")], ROWS[:1])
