"""Reward environments: the ``Environment`` interface, reward-function, reward-model and judge adapters, weighted
rewards, tools (text and native JSON), the shipped tasks, reasoning-gym's tasks, OpenEnv servers."""

from rlkit.envs.arithmetic import (
    ArithmeticEnvironment,
    count_arithmetic_prompts,
    iter_arithmetic_rows,
    make_arithmetic_rows,
)
from rlkit.envs.answers import last_number
from rlkit.envs.base import Conversation, Environment, EnvReturn, Message
from rlkit.envs.judge import JudgeEnvironment, RewardComponent, WeightedRewards, last_number_score
from rlkit.envs.math import MathEnvironment, last_boxed
from rlkit.envs.native_tools import NativeToolEnvironment
from rlkit.envs.openenv_env import OpenEnvEnvironment
from rlkit.envs.reasoning_gym import ReasoningGymEnvironment, reasoning_gym_reward
from rlkit.envs.registry import EnvironmentName, available_environments, make_environment
from rlkit.envs.reward_fn import RewardFn, RewardFunctionEnvironment
from rlkit.envs.reward_model import RewardModelEnvironment, ScorerEnvironment
from rlkit.envs.tool_calls import JsonTool, ToolCall, parse_tool_calls, tool_messages
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
    "JsonTool",
    "JudgeEnvironment",
    "MathEnvironment",
    "Message",
    "NativeToolEnvironment",
    "OpenEnvEnvironment",
    "PythonTool",
    "ReasoningGymEnvironment",
    "RewardComponent",
    "RewardFn",
    "RewardFunctionEnvironment",
    "RewardModelEnvironment",
    "ScorerEnvironment",
    "Tool",
    "ToolCall",
    "ToolEnvironment",
    "WeightedRewards",
    "available_environments",
    "count_arithmetic_prompts",
    "iter_arithmetic_rows",
    "last_boxed",
    "last_number",
    "last_number_score",
    "make_arithmetic_rows",
    "make_environment",
    "parse_tool_calls",
    "reasoning_gym_reward",
    "tool_messages",
]
