"""Environments by name, so a config can say ``env.name: math`` and a notebook ``make_environment("math")``.

The names are a ``Literal`` (``EnvironmentName``) so type checkers and the config validator know the valid
choices; a test keeps the ``Literal`` and the table below in step. Custom reward functions do not go through
the registry: wrap them with ``RewardFunctionEnvironment(fn)`` and hand the environment to the session.
"""

from __future__ import annotations

import difflib
from typing import Any, Callable, Literal, get_args

from rlkit.envs.arithmetic import ArithmeticEnvironment
from rlkit.envs.base import Environment
from rlkit.envs.math import MathEnvironment
from rlkit.envs.tool_arithmetic import ToolArithmeticEnvironment
from rlkit.errors import ConfigError

EnvironmentName = Literal["arithmetic", "math", "tool_arithmetic"]

_FACTORIES: dict[str, Callable[..., Environment]] = {
    "arithmetic": ArithmeticEnvironment,
    "math": MathEnvironment,
    "tool_arithmetic": ToolArithmeticEnvironment,
}


def available_environments() -> tuple[str, ...]:
    """The names ``make_environment`` accepts, in ``EnvironmentName`` order."""
    return get_args(EnvironmentName)


def make_environment(name: EnvironmentName, **kwargs: Any) -> Environment:
    """Build the environment called ``name`` with ``kwargs`` (e.g. ``timeout_seconds`` for ``"math"``)."""
    factory = _FACTORIES.get(name) if isinstance(name, str) else None
    if factory is None:
        names = available_environments()
        close = difflib.get_close_matches(str(name), names, n=1)
        hint = f" (did you mean {close[0]!r}?)" if close else ""
        raise ConfigError([f"env.name: unknown environment {name!r}{hint}; available: {', '.join(names)}"])
    try:
        return factory(**kwargs)
    except TypeError as exc:
        raise ConfigError([f"env: environment {name!r} does not accept {sorted(kwargs)}: {exc}"]) from exc
