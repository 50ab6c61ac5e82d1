"""Reward environments: the ``Environment`` interface, a reward-function adapter and the shipped tasks."""

from rlkit.envs.arithmetic import (
    ArithmeticEnvironment,
    count_arithmetic_prompts,
    iter_arithmetic_rows,
    make_arithmetic_rows,
)
from rlkit.envs.base import Conversation, Environment, EnvReturn, Message
from rlkit.envs.math import MathEnvironment, last_boxed
from rlkit.envs.registry import EnvironmentName, available_environments, make_environment
from rlkit.envs.reward_fn import RewardFn, RewardFunctionEnvironment

__all__ = [
    "ArithmeticEnvironment",
    "Conversation",
    "EnvReturn",
    "Environment",
    "EnvironmentName",
    "MathEnvironment",
    "Message",
    "RewardFn",
    "RewardFunctionEnvironment",
    "available_environments",
    "count_arithmetic_prompts",
    "iter_arithmetic_rows",
    "last_boxed",
    "make_arithmetic_rows",
    "make_environment",
]
