"""Reward environments: the ``Environment`` interface, reward-function and reward-model adapters, tools, the shipped tasks."""

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
from rlkit.envs.reward_model import RewardModelEnvironment, ScorerEnvironment
from rlkit.envs.tool_env import ToolEnvironment
from rlkit.envs.tools import Calculator, FunctionTool, PythonTool, Tool

__all__ = [
    "ArithmeticEnvironment",
    "Calculator",
    "Conversation",
    "EnvReturn",
    "Environment",
    "EnvironmentName",
    "FunctionTool",
    "MathEnvironment",
    "Message",
    "PythonTool",
    "RewardFn",
    "RewardFunctionEnvironment",
    "RewardModelEnvironment",
    "ScorerEnvironment",
    "Tool",
    "ToolEnvironment",
    "available_environments",
    "count_arithmetic_prompts",
    "iter_arithmetic_rows",
    "last_boxed",
    "make_arithmetic_rows",
    "make_environment",
]
