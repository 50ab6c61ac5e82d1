"""Environments by name, so a config can say ``env.name: math`` and a notebook ``make_environment("math")``.

The names are a ``Literal`` (``EnvironmentName``), derived from the table below, so the config validator knows
the valid choices.

A reward function of yours needs no registry line: name it by import path (``env.reward_fn: my_module:my_reward``,
:func:`load_reward_fn`), or wrap it with ``RewardFunctionEnvironment(fn)`` and hand the environment to the session.
The environment runs in the driver process (Ray workers hold only the policy), so the module has to be importable
there only: from the working directory, which is tried when the plain import fails, or from ``PYTHONPATH``. A
module whose file changed since it was imported (``%%writefile`` in a notebook, an editor) is imported again, so a
new Session sees the function as the file has it now.
"""

from __future__ import annotations

import importlib
import os
import sys
from typing import Any, Callable, Literal, Optional, get_args

from rlkit.algorithms.registry import Registry
from rlkit.envs.arithmetic import ArithmeticEnvironment
from rlkit.envs.base import Environment
from rlkit.envs.math import MathEnvironment
from rlkit.envs.reasoning_gym import ReasoningGymEnvironment
from rlkit.envs.tool_arithmetic import NativeToolArithmeticEnvironment, ToolArithmeticEnvironment
from rlkit.errors import ConfigError

_FACTORIES: Registry[Callable[..., Environment]] = Registry("environment")
_FACTORIES.register("arithmetic")(ArithmeticEnvironment)
_FACTORIES.register("math")(MathEnvironment)
_FACTORIES.register("reasoning_gym")(ReasoningGymEnvironment)  # rows of data.task=reasoning_gym:<name>
_FACTORIES.register("tool_arithmetic")(ToolArithmeticEnvironment)
_FACTORIES.register("tool_arithmetic_native")(NativeToolArithmeticEnvironment)
EnvironmentName = Literal[_FACTORIES.names()]  # type: ignore[valid-type]


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


def environment_tool_schemas(name: str) -> Optional[list[dict[str, Any]]]:
    """The JSON tool declarations the environment called ``name`` renders through the chat template (``tools=``),
    without building it; None for an environment without native tools. The SFT stage's prompts need them."""
    factory = _FACTORIES.get(name) if isinstance(name, str) and name in _FACTORIES else None
    schemas = getattr(factory, "default_tool_schemas", None)
    return schemas() if callable(schemas) else None


def load_reward_fn(path: str) -> Callable[..., list[float]]:
    """The function ``path`` names, ``"module:function"`` (``"pkg.module:Class.method"`` too), imported here;
    a module not on ``sys.path`` is looked for in the working directory as well (``rlkit train`` does not put it
    there). ConfigError names ``env.reward_fn``, what failed and where it looked."""
    module_name, sep, attr = path.partition(":") if isinstance(path, str) else ("", "", "")
    if not sep or not module_name or not attr:
        raise ConfigError([f"env.reward_fn: {path!r} is not of the form 'module:function' "
                           "(e.g. my_rewards:reverse_reward, "
                           "a function in my_rewards.py in the working directory)"])
    try:
        module = _import_here_or_cwd(module_name)
    except Exception as exc:  # noqa: BLE001 - an import error of the user's module, reported with the key
        raise ConfigError([f"env.reward_fn: cannot import module {module_name!r} "
                           f"({type(exc).__name__}: {exc}); it must "
                           f"be importable from the working directory ({os.getcwd()}) or PYTHONPATH"]) from exc
    fn: Any = module
    for part in attr.split("."):
        fn = getattr(fn, part, None)
    if not callable(fn):
        raise ConfigError([f"env.reward_fn: module {module_name!r} "
                           f"({getattr(module, '__file__', '?')}) has no function "
                           f"{attr!r}" + ("" if fn is None else f" (it is a {type(fn).__name__})")])
    return fn


def reward_fn_path(fn: Any) -> Optional[str]:
    """``"module:qualname"`` of a function that :func:`load_reward_fn` can import again in another process, or None
    (a function defined in a notebook or ``__main__``, a lambda, a closure)."""
    module, qualname = getattr(fn, "__module__", None), getattr(fn, "__qualname__", None)
    if not module or not qualname or module == "__main__" or "<" in qualname:
        return None
    path = f"{module}:{qualname}"
    try:
        return path if load_reward_fn(path) is fn else None
    except ConfigError:
        return None


_SOURCE_SEEN: dict[str, tuple[int, int]] = {}  # module name -> (mtime_ns, size) of its file when last imported here


def _source_stamp(module: Any) -> Optional[tuple[int, int]]:
    path = getattr(module, "__file__", None)
    if not path or not path.endswith(".py") or not os.path.exists(path):
        return None
    st = os.stat(path)
    return st.st_mtime_ns, st.st_size


def _stale(module: Any) -> bool:
    """Whether ``module``'s source file changed since the module was imported: against the stamp taken when this
    file imported it, or (imported elsewhere first) the source mtime and size its bytecode was compiled from."""
    stamp = _source_stamp(module)
    if stamp is None:
        return False
    seen = _SOURCE_SEEN.get(module.__name__)
    if seen is None:
        cached = getattr(getattr(module, "__spec__", None), "cached", None)
        try:
            header = open(cached, "rb").read(16) if cached else b""
        except OSError:
            header = b""
        if len(header) < 16 or int.from_bytes(header[4:8], "little") & 1:  # no bytecode, or checked by hash
            _SOURCE_SEEN[module.__name__] = stamp
            return False
        compiled_from = (int.from_bytes(header[8:12], "little"), int.from_bytes(header[12:16], "little"))
        return ((stamp[0] // 10**9) & 0xFFFFFFFF, stamp[1] & 0xFFFFFFFF) != compiled_from
    return stamp != seen


def _import_here_or_cwd(name: str) -> Any:
    """The module ``name``, imported again when its file changed since its last import (see the docstring)."""
    module = sys.modules.get(name)
    if module is not None and _stale(module):
        cached = getattr(module.__spec__, "cached", None)
        if cached and os.path.exists(cached):  # its bytecode may be from an edit in the same second, same size
            os.remove(cached)
        module = importlib.reload(module)
    elif module is None:
        module = _import_or_cwd(name)
    if (stamp := _source_stamp(module)) is not None:
        _SOURCE_SEEN[name] = stamp
    return module


def _import_or_cwd(name: str) -> Any:
    try:
        return importlib.import_module(name)
    except ModuleNotFoundError as exc:
        cwd = os.getcwd()
        if exc.name != name.split(".")[0] or cwd in sys.path:
            raise
        sys.path.append(cwd)  # after the installed packages: a file here never shadows one of them
        try:
            return importlib.import_module(name)
        except ModuleNotFoundError:
            sys.path.remove(cwd)
            raise
