"""The keys that let a chat model learn the generated arithmetic task: ``data.operations``, ``data.prompt_template``
and ``env.answer_from``, validated end to end through ``load_config`` and built into the environment."""

import pytest

from rlkit.builders import build_environment
from rlkit.config.loading import load_config
from rlkit.errors import ConfigError

CHAT = ['data.prompt_template=What is {prompt}? Answer with just the number.', 'data.operations=[+,-,"*"]',
        "data.digits=2", "env.answer_from=last_number"]


def test_a_chat_arithmetic_config_validates_and_builds_its_environment():
    config = load_config("quickstart_nano", CHAT)
    assert config.data.prompt_template == "What is {prompt}? Answer with just the number."
    assert config.data.operations == ("+", "-", "*") and config.env.answer_from == "last_number"
    env = build_environment(config)
    assert env.answer_from == "last_number"
    convs = [[{"role": "user", "content": "What is 27+82? Answer with just the number."},
              {"role": "assistant", "content": "27 + 82 = 109"}]]
    assert env.step(convs, [{"answer": "109"}]).rewards.tolist() == [1.0]


def test_defaults_leave_the_presets_as_they_were():
    config = load_config("quickstart_nano")
    assert config.data.operations == ("+",) and config.data.prompt_template is None
    assert config.env.answer_from == "completion" and build_environment(config).answer_from == "completion"


@pytest.mark.parametrize("overrides, message", [
    (["env.name=math", "env.answer_from=last_number"],
     "env.answer_from: 'last_number' is supported by env.name=arithmetic or reasoning_gym only, not "
     "env.name='math'"),
    (["env.reward_fn=my_rewards:reward", "env.answer_from=last_number"],
     "env.answer_from: 'last_number' is read by env.name's environment, which env.reward_fn replaces"),
    (["env.answer_from=first"], "env.answer_from: Input should be 'completion' or 'last_number'"),
    (["data.operations=[+,/]"], "data.operations: Input should be '+', '-' or '*'"),
    (["data.prompt_template=What is it?"], "data.prompt_template: 'What is it?' has no {prompt}"),
])
def test_problems_name_the_key(overrides, message):
    with pytest.raises(ConfigError) as info:
        load_config("quickstart_nano", overrides)
    assert message in str(info.value)


def test_every_problem_is_reported_at_once():
    with pytest.raises(ConfigError) as info:
        load_config("quickstart_nano", ["data.prompt_template=Q {p}", "data.operations=[]", "env.name=math",
                                        "env.answer_from=last_number"])
    text = str(info.value)
    assert "data.prompt_template" in text and "data.operations" in text and "env.answer_from" in text
