"""Environments by name, so a config can say ``env.name: math`` and a notebook ``make_environment("math")``.

The names are a ``Literal`` (``EnvironmentName``) so type checkers and the config validator know the valid
choices; a test keeps the ``Literal`` and the table below in step. Custom reward functions do not go through
the registry: wrap them with ``RewardFunctionEnvironment(fn)`` and hand the environment to the session.
"""

from __future__ import annotations

from typing import Any, Callable, Literal, get_args

from rlkit.algorithms.registry import Registry
from rlkit.envs.arithmetic import ArithmeticEnvironment
from rlkit.envs.base import Environment
from rlkit.envs.math import MathEnvironment
from rlkit.envs.tool_arithmetic import ToolArithmeticEnvironment
from rlkit.errors import ConfigError

EnvironmentName = Literal["arithmetic", "math", "tool_arithmetic"]

_FACTORIES: Registry[Callable[..., Environment]] = Registry("environment")
_FACTORIES.register("arithmetic")(ArithmeticEnvironment)
_FACTORIES.register("math")(MathEnvironment)
_FACTORIES.register("tool_arithmetic")(ToolArithmeticEnvironment)


def available_environments() -> tuple[str, ...]:
    """The names ``make_environment`` accepts, in ``EnvironmentName`` order."""
    return get_args(EnvironmentName)


def make_environment(name: EnvironmentName, **kwargs: Any) -> Environment:
    """Build the environment called ``name`` with ``kwargs`` (e.g. ``timeout_seconds`` for ``"math"``)."""
    if not isinstance(name, str) or name not in _FACTORIES:
        raise ConfigError([f"env.name: {_FACTORIES.unknown_message(name)}"])
    try:
        return _FACTORIES.get(name)(**kwargs)
    except TypeError as exc:
        raise ConfigError([f"env: environment {name!r} does not accept {sorted(kwargs)}: {exc}"]) from exc
