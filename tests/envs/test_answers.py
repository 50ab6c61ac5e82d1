"""``env.answer_from=last_number``: the last number a completion writes, for the arithmetic and reasoning-gym
environments. The expected numbers are read off the texts by hand; the reasoning-gym reference is the task's own
``score_answer`` called on reasoning-gym's own entries with the hand-extracted number."""

import inspect

import pytest
import reasoning_gym
from reasoning_gym.utils import SYSTEM_PROMPTS

from rlkit.data import DataParams, load_prompt_dataset
from rlkit.data.reasoning_gym import VALIDATION_SEED_OFFSET
from rlkit.envs import ArithmeticEnvironment, ReasoningGymEnvironment, make_environment
from rlkit.envs.answers import ANSWER_FROM_ENVS, last_number
from rlkit.envs.reasoning_gym import extract_answer
from rlkit.envs.registry import _FACTORIES


def conversations(prompt, completions):
    return [[{"role": "user", "content": prompt}, {"role": "assistant", "content": c}] for c in completions]


@pytest.mark.parametrize("text, number", [
    ("27 + 82 = 109", "109"),
    ("The answer is -46.", "-46"),
    ("1,200", "1200"),
    ("about 1,234,567 people", "1234567"),
    ("3.5", "3.5"),
    ("half of 7 is 3.5.", "3.5"),
    ("27-82 = -55", "-55"),
    ("27-82", "82"),  # a minus after a digit is the operation, not a sign
    ("(3)-4", "4"),
    ("x = +5", "5"),
    ("1,2000", "2000"),  # not a thousands group: 1, then 2000
    ("3, 5 and 7", "7"),
    ("109.0", "109.0"),  # no normalisation: it does not equal "109"
    ("no number here", None),
    ("", None),
])
def test_last_number(text, number):
    assert last_number(text) == number


def test_arithmetic_last_number_scores_the_last_number():
    rows = [{"prompt": "What is 27+82?", "answer": "109"}] * 6 + [{"prompt": "3-7", "answer": "-4"}]
    completions = ["27 + 82 = 109", "109", "It is 109.", "109 is wrong, it is 110", "I don't know", "109.0",
                   "3 - 7 = -4"]
    out = ArithmeticEnvironment(answer_from="last_number").step(conversations("q", completions), rows)
    assert out.rewards.tolist() == [1.0, 1.0, 1.0, 0.0, 0.0, 0.0, 1.0]
    assert [m["parsed"] for m in out.metadata] == ["109", "109", "109", "110", None, "109.0", "-4"]
    assert out.metadata[4] == {"parsed": None, "correct": False} and out.errors == []
    # the default rule is unchanged: the whole completion, stripped
    default = make_environment("arithmetic").step(conversations("q", completions), rows)
    assert default.rewards.tolist() == [0.0, 1.0, 0.0, 0.0, 0.0, 0.0, 0.0]


def test_make_environment_passes_answer_from_and_refuses_bad_values():
    assert make_environment("arithmetic", answer_from="last_number").answer_from == "last_number"
    assert make_environment("reasoning_gym", answer_from="last_number").answer_from == "last_number"
    with pytest.raises(ValueError, match="answer_from must be one of"):
        ArithmeticEnvironment(answer_from="first_number")


def test_answer_from_envs_are_the_ones_that_take_it():
    takes = {name for name in _FACTORIES.names() if "answer_from" in inspect.signature(_FACTORIES.get(name)).parameters}
    assert takes == set(ANSWER_FROM_ENVS)


@pytest.mark.parametrize("name", ["basic_arithmetic", "chain_sum"])
def test_reasoning_gym_last_number_is_score_answer_of_the_extracted_number(name):
    rows = load_prompt_dataset(DataParams(task=f"reasoning_gym:{name}", num_train=1, num_validation=3))["validation"]
    reference = reasoning_gym.create_dataset(name, seed=VALIDATION_SEED_OFFSET, size=3)
    env = make_environment("reasoning_gym", answer_from="last_number")
    for i, row in enumerate(rows):
        entry, answer = reference[i], reference[i]["answer"]
        completions = [f"Working it out: so it is {answer}.", f"{answer}",
                       f"{answer} or maybe 1000001", "no idea"]
        extracted = [answer, answer, "1000001", None]  # by hand: the last number of each
        out = env.step(conversations(row["prompt"], completions), [row] * len(completions))
        expected = [float(reference.score_answer(e, entry)) for e in extracted]
        assert expected[:2] == [1.0, 1.0] and expected[2] < 1.0 and expected[3] == 0.0
        assert out.errors == [] and out.rewards.tolist() == pytest.approx(expected)
        assert [m["parsed"] for m in out.metadata] == extracted
    # the default rule on the sentence: the whole stripped sentence, which is not the answer
    assert make_environment("reasoning_gym").step(conversations(rows[0]["prompt"], [f"so it is {rows[0]['answer']}."]),
                                                  [rows[0]]).rewards.item() < 1.0


def test_reasoning_gym_last_number_reads_inside_the_tag_when_there_is_one():
    params = DataParams(task="reasoning_gym:chain_sum", num_train=1, num_validation=1,
                        system_prompt=SYSTEM_PROMPTS["default"])
    row = load_prompt_dataset(params)["validation"][0]
    answer = row["answer"]
    completions = [f"<think>1 + 1 = 2</think><answer>the sum is {answer}</answer> (checked 3 times)",
                   f"no tag, but the sum is {answer}", f"<answer>{answer}</answer> then 7", "<answer>none</answer> 5"]
    assert [extract_answer(c, True, "last_number") for c in completions] == [answer, answer, answer, None]
    out = ReasoningGymEnvironment(answer_from="last_number").step(conversations(row["prompt"], completions),
                                                                    [row] * 4)
    assert out.rewards.tolist() == [1.0, 1.0, 1.0, 0.0]
    # the default rule: the tag's text as is (a sentence is not the answer), None without a tag
    default = ReasoningGymEnvironment().step(conversations(row["prompt"], completions), [row] * 4)
    reference = reasoning_gym.create_dataset("chain_sum", seed=VALIDATION_SEED_OFFSET, size=1)
    sentence = reference.score_answer(f"the sum is {answer}", reference[0])  # the scorer's partial credit
    assert sentence < 1.0 and default.rewards.tolist() == pytest.approx([sentence, 0.0, 1.0, 0.0])
    assert [m["parsed"] for m in default.metadata] == [f"the sum is {answer}", None, answer, "none"]
