"""Environments by typed name; unknown names list the choices."""

from typing import get_args

import pytest

from rlkit.envs import ArithmeticEnvironment, EnvironmentName, MathEnvironment, available_environments, make_environment
from rlkit.envs.registry import _FACTORIES
from rlkit.errors import ConfigError


def test_literal_and_table_agree():
    assert available_environments() == get_args(EnvironmentName) == tuple(_FACTORIES)


def test_make_each_environment_with_kwargs():
    assert isinstance(make_environment("arithmetic"), ArithmeticEnvironment)
    env = make_environment("math", timeout_seconds=1.5)  # workers start on the first step, so this is cheap
    try:
        assert isinstance(env, MathEnvironment) and env.timeout_seconds == 1.5
    finally:
        env.close()


def test_unknown_name_lists_choices_and_suggests():
    with pytest.raises(ConfigError, match=r"env.name: unknown environment 'maths' \(did you mean 'math'\?\); "
                                          r"available: 'arithmetic', 'math', 'reasoning_gym', 'tool_arithmetic', "
                                          r"'tool_arithmetic_native'$"):
        make_environment("maths")


def test_unknown_kwarg_is_a_config_error():
    with pytest.raises(ConfigError, match="'arithmetic' does not accept \\['digits'\\]"):
        make_environment("arithmetic", digits=3)
