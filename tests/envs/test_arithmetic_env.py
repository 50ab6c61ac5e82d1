"""The synthetic arithmetic task: documented operand distribution, correct answers, exact-match reward."""

import re
from collections import Counter

import pytest

from rlkit.envs import ArithmeticEnvironment, count_arithmetic_prompts, make_arithmetic_rows

EXPR = re.compile(r"^(\d+)([+*-])(\d+)$")


def test_rows_are_deterministic_given_seed():
    assert make_arithmetic_rows(50, 3, seed=7) == make_arithmetic_rows(50, 3, seed=7)
    assert make_arithmetic_rows(50, 3, seed=7) != make_arithmetic_rows(50, 3, seed=8)
    assert make_arithmetic_rows(0, 3, seed=7) == []


def test_answers_are_correct_for_every_operation():
    rows = make_arithmetic_rows(300, 2, seed=0, operations=("+", "-", "*"))
    ops = Counter()
    for row in rows:
        a, op, b = EXPR.match(row["prompt"]).groups()
        ops[op] += 1
        expected = {"+": int(a) + int(b), "-": int(a) - int(b), "*": int(a) * int(b)}[op]
        assert row["answer"] == str(expected), row
    assert set(ops) == {"+", "-", "*"}
    assert any(row["answer"].startswith("-") for row in rows)  # subtraction can go negative


def test_operand_lengths_are_uniform_over_one_to_digits_without_leading_zeros():
    rows = make_arithmetic_rows(3000, 3, seed=1)
    operands = [x for row in rows for x in EXPR.match(row["prompt"]).group(1, 3)]
    assert all(x == "0" or not x.startswith("0") for x in operands)
    lengths = Counter(len(x) for x in operands)
    assert set(lengths) == {1, 2, 3}
    for d in (1, 2, 3):
        assert abs(lengths[d] / len(operands) - 1 / 3) < 0.03, lengths


def test_bad_arguments_and_prompt_count():
    with pytest.raises(ValueError, match="digits"):
        make_arithmetic_rows(1, 0, seed=0)
    with pytest.raises(ValueError, match="operations"):
        make_arithmetic_rows(1, 2, seed=0, operations=("/",))
    assert count_arithmetic_prompts(1) == 100
    assert count_arithmetic_prompts(2, ("+", "*")) == 2 * 100**2


def test_exact_match_reward_and_metadata():
    rows = [{"prompt": "123+45", "answer": "168"}] * 5 + [{"prompt": "1+1"}]
    completions = [" 168\n", "168", "168.", "0168", "the answer is 168", "2"]
    convs = [[{"role": "user", "content": r["prompt"]}, {"role": "assistant", "content": c}]
             for r, c in zip(rows, completions)]
    out = ArithmeticEnvironment().step(convs, rows)
    assert out.rewards.tolist() == [1.0, 1.0, 0.0, 0.0, 0.0, 0.0]
    assert out.metadata[0] == {"parsed": "168", "correct": True}
    assert out.metadata[2] == {"parsed": "168.", "correct": False}
    assert out.errors == ["sample 5: KeyError: 'answer'"]  # the row without an answer, contained
    with pytest.raises(ValueError, match="rows"):
        ArithmeticEnvironment().step(convs, rows[:2])
