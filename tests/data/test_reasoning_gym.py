"""reasoning-gym's tasks by name (``data.task=reasoning_gym:<name>``): rows, disjoint splits, config problems, the
weighted mix, the metadata column, ``rlkit tasks``. The reference is reasoning-gym itself, called directly."""

import json
import sys
from collections import Counter
from typing import get_args

import pytest
import reasoning_gym

from rlkit.cli import main
from rlkit.config.loading import load_config
from rlkit.data import DataParams, load_prompt_dataset
from rlkit.data.prompts import TASK_DESCRIPTIONS, Task
from rlkit.data.reasoning_gym import VALIDATION_SEED_OFFSET
from rlkit.envs.reasoning_gym import ReasoningGymMissing, decode_metadata, encode_metadata, import_reasoning_gym
from rlkit.errors import ConfigError

COLUMNS = ["prompt", "answer", "task", "task_config", "metadata", "answer_tag"]


@pytest.mark.parametrize("name, config", [("chain_sum", {"min_digits": 1, "max_digits": 2}),
                                          ("leg_counting", {"max_animals": 3}),
                                          ("spell_backward", {}),
                                          ("basic_arithmetic", {"max_terms": 3})])
def test_a_task_loads_by_name_as_reasoning_gym_makes_it(name, config):
    ds = load_prompt_dataset(DataParams(task=f"reasoning_gym:{name}", task_config=config, num_train=12,
                                        num_validation=6, seed=5))
    assert (len(ds["train"]), len(ds["validation"])) == (12, 6)
    assert ds["train"].column_names == COLUMNS
    # validation is reasoning-gym's own stream at seed + 2**24, train its stream at the seed (no repeats here)
    held_out = reasoning_gym.create_dataset(name, **config, seed=5 + VALIDATION_SEED_OFFSET, size=6)
    train = reasoning_gym.create_dataset(name, **config, seed=5, size=12)
    for rows, reference in ((ds["validation"], held_out), (ds["train"], train)):
        assert rows["prompt"] == [e["question"] for e in reference]
        assert rows["answer"] == [e["answer"] for e in reference]
        assert [decode_metadata(m) for m in rows["metadata"]] == [e["metadata"] for e in reference]
    assert set(ds["train"]["task"]) == {name} and set(ds["train"]["task_config"]) == {
        json.dumps(config, sort_keys=True)}
    assert not any(ds["train"]["answer_tag"])


def test_splits_are_disjoint_train_drops_held_out_questions():
    # chain_sum with two one-digit terms has 200 questions: a train stream of 150 hits held-out ones
    config = {"min_terms": 2, "max_terms": 2, "min_digits": 1, "max_digits": 1}
    ds = load_prompt_dataset(DataParams(task="reasoning_gym:chain_sum", task_config=config, num_train=150,
                                        num_validation=60))
    validation, train = ds["validation"]["prompt"], ds["train"]["prompt"]
    assert len(set(validation)) == 60 and not set(train) & set(validation)
    stream = [e["question"] for e in reasoning_gym.create_dataset("chain_sum", **config, seed=0, size=400)]
    dropped = [q for q in stream[:150] if q in set(validation)]
    assert len(dropped) > 10  # the drop was exercised ...
    assert train == [q for q in stream if q not in set(validation)][:150]  # ... and train is the rest, in order


def test_too_few_distinct_questions_is_a_config_error():
    # leg_counting with one animal, one instance: at most ~ the number of animals distinct questions
    with pytest.raises(ConfigError, match=r"data.num_validation=2000: reasoning_gym:leg_counting .* gave only \d+ "
                                          r"distinct questions .* lower data.num_validation"):
        load_prompt_dataset(DataParams(task="reasoning_gym:leg_counting", num_validation=2000, num_train=1,
                                       task_config={"min_animals": 1, "max_animals": 1, "max_instances": 1}))


def test_unknown_task_and_keys_name_the_fix():
    with pytest.raises(ConfigError) as info:
        load_config("quickstart", ["data.task=reasoning_gym:chain_summ"])
    assert "reasoning-gym has no task 'chain_summ' (did you mean reasoning_gym:chain_sum" in str(info.value)
    with pytest.raises(ConfigError) as info:
        load_config("quickstart", ["data.task=chain_sum"])  # the bare name: one problem, with the prefix to use
    assert info.value.problems == [
        "data.task: unknown task 'chain_sum'; rlkit's generated tasks are 'arithmetic', 'tool_arithmetic', "
        "'tool_arithmetic_native', and reasoning-gym's are named 'reasoning_gym:<name>' (`rlkit tasks` lists them); "
        "did you mean 'reasoning_gym:chain_sum'? (got 'chain_sum')"]
    with pytest.raises(ConfigError) as info:
        load_config("quickstart", ["data.task=reasoning_gym:chain_sum", "data.task_config.max_digitz=2",
                                   "data.task_config.seed=3"])
    assert info.value.problems == [
        "data.task_config.max_digitz: reasoning-gym task 'chain_sum' has no key 'max_digitz'; did you mean "
        "data.task_config.max_digits? (its keys: min_terms, max_terms, min_digits, max_digits, allow_negation)",
        "data.task_config.seed: set by rlkit, from data.seed and data.num_train / data.num_validation; remove it",
        "env.name='arithmetic': data.task='reasoning_gym:chain_sum' rows are scored by their task's own "
        "score_answer, which env.name=reasoning_gym calls. Fix: set env.name=reasoning_gym (or env.reward_fn to a "
        "reward of yours)"]
    problems = DataParams(task="reasoning_gym:chain_sum", task_config={"min_digits": 3, "max_digits": 2}).problems()
    assert problems == ["data.task_config={'min_digits': 3, 'max_digits': 2}: reasoning-gym's chain_sum config refuses "
                        "it (AssertionError: max_digits must be >= min_digits). Fix: change the values (its keys: "
                        "min_terms, max_terms, min_digits, max_digits, allow_negation)"]
    assert DataParams(task="arithmetic", task_config={"a": 1}).problems() == [
        "data.task_config: only read with data.task=reasoning_gym:<name> (the generator's keys); remove it, or name a "
        "reasoning-gym task"]


def test_a_valid_run_config_with_a_reasoning_gym_task():
    config = load_config("quickstart", ["data.task=reasoning_gym:leg_counting", "data.task_config.max_animals=3",
                                        "env.name=reasoning_gym"])
    assert config.data.task == "reasoning_gym:leg_counting" and config.data.task_config == {"max_animals": 3}
    with pytest.raises(ConfigError, match=r"env.name='reasoning_gym': it scores rows made by data.task=reasoning_gym"):
        load_config("quickstart", ["env.name=reasoning_gym"])  # the quickstart's arithmetic rows


def test_weighted_mix_is_reasoning_gyms_composite_and_each_row_knows_its_task():
    mix = {"datasets": [{"name": "chain_sum", "weight": 3, "config": {"max_digits": 2}},
                        {"name": "leg_counting", "config": {"min_animals": 1, "max_animals": 2}}]}  # weight: 1
    ds = load_prompt_dataset(DataParams(task="reasoning_gym:composite", task_config=mix, num_train=200,
                                        num_validation=20, seed=1))
    train = ds["train"]
    counts = Counter(train["task"])
    assert set(counts) == {"chain_sum", "leg_counting"} and 0.62 < counts["chain_sum"] / 200 < 0.88
    configs = {t: c for t, c in zip(train["task"], train["task_config"])}
    assert configs == {"chain_sum": '{"max_digits": 2}', "leg_counting": '{"max_animals": 2, "min_animals": 1}'}
    for row in train.select(range(20)):
        expected = "State the final answer" if row["task"] == "chain_sum" else "count how many legs"
        assert expected in row["prompt"] and decode_metadata(row["metadata"])["source_dataset"] == row["task"]
    assert not set(train["prompt"]) & set(ds["validation"]["prompt"])


def test_mix_problems_are_listed_by_dotted_key():
    mix = {"datasets": [{"name": "chain_sum", "weight": 0, "config": {"max_digitz": 2}}, {"name": "leg_countin"},
                        {"name": "chain_sum", "wieght": 1}], "size": 3}
    assert DataParams(task="reasoning_gym:composite", task_config=mix).problems() == [
        "data.task_config.size: the composite's only key is datasets, a weighted list of tasks: [{name: chain_sum, "
        "weight: 2}, {name: leg_counting, weight: 1, config: {max_animals: 5}}]",
        "data.task_config.datasets[0].weight: must be a number > 0, got 0",
        "data.task_config.datasets[0].config.max_digitz: reasoning-gym task 'chain_sum' has no key 'max_digitz'; did "
        "you mean data.task_config.datasets[0].config.max_digits? (its keys: min_terms, max_terms, min_digits, "
        "max_digits, allow_negation)",
        "data.task_config.datasets[1].name: reasoning-gym has no task 'leg_countin' (did you mean "
        "reasoning_gym:leg_counting or reasoning_gym:letter_counting or reasoning_gym:rectangle_count?); `rlkit "
        "tasks` lists them",
        "data.task_config.datasets[2].wieght: unknown key; a task of the mix has name, weight, config",
        "data.task_config.datasets[2].name: 'chain_sum' is in the mix twice; give it once, with the sum of the "
        "weights"]
    assert DataParams(task="reasoning_gym:composite").problems()[0].startswith(
        "data.task_config.datasets: the composite needs a non-empty list of tasks")


def test_answer_tag_follows_the_system_prompt():
    from reasoning_gym.utils import SYSTEM_PROMPTS

    ds = load_prompt_dataset(DataParams(task="reasoning_gym:chain_sum", num_train=3, num_validation=2,
                                        system_prompt=SYSTEM_PROMPTS["default"]))
    assert ds["train"]["answer_tag"] == [True] * 3 and ds["validation"]["answer_tag"] == [True] * 2


def test_metadata_column_keeps_python_types():
    metadata = {"grid": ((1, 2), (3, 4)), "seen": {"b", "a"}, 7: [None, 1.5, "x"], "nested": {"__tuple__": 1}}
    text = encode_metadata(metadata)
    assert isinstance(text, str) and decode_metadata(text) == metadata
    assert type(decode_metadata(text)["grid"][0]) is tuple and plain_json_would_differ(metadata)


def plain_json_would_differ(value) -> bool:
    return json.loads(json.dumps(value, default=list)) != value


def test_rlkit_imports_and_explains_without_reasoning_gym(monkeypatch):
    monkeypatch.setitem(sys.modules, "reasoning_gym", None)  # as if not installed
    with pytest.raises(ReasoningGymMissing, match=r"pip install rlkit\[reasoning-gym\]"):
        import_reasoning_gym()
    problems = DataParams(task="reasoning_gym:chain_sum").problems()
    assert (len(problems) == 1
            and problems[0].startswith("data.task='reasoning_gym:chain_sum': reasoning-gym is not installed")
            and "pip install rlkit[reasoning-gym]" in problems[0])


def test_rlkit_tasks_lists_both_kinds_and_one_tasks_keys(capsys):
    assert tuple(TASK_DESCRIPTIONS) == get_args(Task)  # every rlkit task has its line
    assert main(["tasks"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].split()[0] == "arithmetic" and len(lines) == 3 + len(reasoning_gym.factory.DATASETS)
    assert any(line.split(None, 1) == ["reasoning_gym:chain_sum",
                                       "Generates simple arithmetic tasks using only + and - operators"]
               for line in lines)
    assert main(["tasks", "reasoning_gym:chain_sum"]) == 0
    out = capsys.readouterr().out
    assert "  max_digits: 4\n" in out and "  allow_negation: false\n" in out and "seed" not in out
    assert main(["tasks", "chain_summ"]) == 2
    assert "did you mean 'reasoning_gym:chain_sum'" in capsys.readouterr().err
