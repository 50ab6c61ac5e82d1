"""``env.name: reasoning_gym``: each row scored by its task's own ``score_answer``. The reference is reasoning-gym's
scorer called directly on reasoning-gym's own entries (not the rows), on the same answers."""

import pytest
import reasoning_gym
from reasoning_gym.utils import SYSTEM_PROMPTS

from rlkit.data import DataParams, load_prompt_dataset
from rlkit.data.reasoning_gym import VALIDATION_SEED_OFFSET
from rlkit.envs import ReasoningGymEnvironment, make_environment
from rlkit.envs.reasoning_gym import extract_answer

TASKS = ["basic_arithmetic", "chain_sum", "leg_counting", "spell_backward", "countdown"]


def conversations(prompt, completions):
    return [[{"role": "user", "content": prompt}, {"role": "assistant", "content": c}] for c in completions]


def answers_to_try(answer):
    """Right, right with whitespace, wrong, a prefix (spell_backward's partial credit), the answer in a sentence
    (partial credit of the default scorer)."""
    return [answer, f"  {answer}\n", "wrong", answer[: max(1, len(answer) // 2)], f"{answer} is it"]


@pytest.mark.parametrize("name", TASKS)
def test_reward_is_the_tasks_own_score_answer(name):
    rows = load_prompt_dataset(DataParams(task=f"reasoning_gym:{name}", num_train=1, num_validation=3))["validation"]
    reference = reasoning_gym.create_dataset(name, seed=VALIDATION_SEED_OFFSET, size=3)
    env = make_environment("reasoning_gym")
    for i, row in enumerate(rows):
        entry = reference[i]
        completions = answers_to_try(entry["answer"])
        out = env.step(conversations(row["prompt"], completions), [row] * len(completions))
        expected = [reference.score_answer(c.strip(), entry) for c in completions]
        assert out.errors == [] and out.rewards.tolist() == pytest.approx(expected, rel=1e-6)
        assert expected[0] == expected[1] == 1.0 and expected[2] < 1.0


def test_partial_credit_comes_through():
    row = load_prompt_dataset(DataParams(task="reasoning_gym:spell_backward", num_train=1,
                                         num_validation=1))["validation"][0]
    reference = reasoning_gym.create_dataset("spell_backward", seed=VALIDATION_SEED_OFFSET, size=1)
    half = row["answer"][: len(row["answer"]) // 2]
    reward = make_environment("reasoning_gym").step(conversations(row["prompt"], [half]), [row]).rewards.item()
    assert 0 < reward < 1 and reward == pytest.approx(reference.score_answer(half, reference[0]), rel=1e-6)


def test_answer_tag_uses_reasoning_gyms_extractor_when_the_prompt_asks_for_it():
    params = DataParams(task="reasoning_gym:chain_sum", num_train=1, num_validation=1,
                        system_prompt=SYSTEM_PROMPTS["default"])
    row = load_prompt_dataset(params)["validation"][0]
    answer = row["answer"]
    completions = [f"<think>add them up</think>\n<answer> {answer} </answer>", f"the sum is {answer}",
                   f"<answer>1</answer> no, <answer>{answer}</answer>", "<answer>wrong</answer>"]
    rewards = make_environment("reasoning_gym").step(conversations(row["prompt"], completions), [row] * 4).rewards
    assert rewards.tolist() == [1.0, 0.0, 1.0, 0.0]  # no tag: reasoning-gym's None, 0; the last tag counts
    assert extract_answer(f"<answer>{answer}</answer>", answer_tag=False) == f"<answer>{answer}</answer>"


def test_a_mix_scores_each_row_by_its_own_task_as_the_composite_does():
    mix = {"datasets": [{"name": "chain_sum", "weight": 1}, {"name": "spell_backward", "weight": 1}]}
    rows = load_prompt_dataset(DataParams(task="reasoning_gym:composite", task_config=mix, num_train=1,
                                          num_validation=8))["validation"]
    assert set(rows["task"]) == {"chain_sum", "spell_backward"}
    from reasoning_gym.composite import DatasetSpec

    composite = reasoning_gym.create_dataset("composite",
                                             datasets=[DatasetSpec(**d, config={}) for d in mix["datasets"]],
                                             seed=VALIDATION_SEED_OFFSET, size=8)
    env = ReasoningGymEnvironment()
    for i, row in enumerate(rows):
        entry = composite[i]
        assert entry["question"] == row["prompt"]
        completions = answers_to_try(entry["answer"])
        expected = [composite.score_answer(c.strip(), entry) for c in completions]
        assert (env.step(conversations(row["prompt"], completions), [row] * 5).rewards.tolist()
                == pytest.approx(expected))


def test_a_row_that_cannot_be_scored_costs_only_its_own_reward():
    rows = list(load_prompt_dataset(DataParams(task="reasoning_gym:chain_sum", num_train=1,
                                               num_validation=2))["validation"])
    broken = {**rows[1], "task": "no_such_task"}
    out = make_environment("reasoning_gym").step(
        conversations(rows[0]["prompt"], [rows[0]["answer"]]) + conversations(broken["prompt"], [broken["answer"]]),
        [rows[0], broken])
    assert out.rewards.tolist() == [1.0, 0.0] and len(out.errors) == 1 and "no_such_task" in out.errors[0]
