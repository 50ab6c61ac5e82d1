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


def test_a_reward_module_edited_between_two_loads_is_imported_again(tmp_path, monkeypatch):
    """The notebook workflow: %%writefile the module, build a Session (load_reward_fn), edit the file, build
    another: the second sees the new code, and a function appended to the file is found."""
    from rlkit.envs.registry import load_reward_fn

    module = tmp_path / "edited_reward_mod.py"
    module.write_text("def f(prompts, completions, **columns):\n    return [0.0] * len(completions)\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.delitem(__import__("sys").modules, "edited_reward_mod", raising=False)
    assert load_reward_fn("edited_reward_mod:f")([""], ["x"]) == [0.0]
    module.write_text("def f(prompts, completions, **columns):\n    return [1.0] * len(completions)\n")
    assert load_reward_fn("edited_reward_mod:f")([""], ["x"]) == [1.0]  # same size, same second: still new
    module.write_text(module.read_text() + "\n\ndef g(prompts, completions, **columns):\n    return [2.0]\n")
    assert load_reward_fn("edited_reward_mod:g")([""], ["x"]) == [2.0]
    unchanged = load_reward_fn("edited_reward_mod:g")
    assert load_reward_fn("edited_reward_mod:g") is unchanged  # an unchanged file is not imported again


def test_a_module_imported_elsewhere_first_is_reloaded_once_its_file_changes(tmp_path, monkeypatch):
    import importlib
    import os
    import sys

    from rlkit.envs.registry import load_reward_fn

    module = tmp_path / "imported_first_mod.py"
    module.write_text("def f(prompts, completions, **columns):\n    return [0.0] * len(completions)\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.delitem(sys.modules, "imported_first_mod", raising=False)
    monkeypatch.setattr(sys, "dont_write_bytecode", False)  # as in a notebook kernel (PYTHONDONTWRITEBYTECODE unset)
    importlib.import_module("imported_first_mod")  # the user's own `import`, before rlkit saw it
    module.write_text("def f(prompts, completions, **columns):\n    return [1.0] * len(completions)\n")
    stat = module.stat()
    os.utime(module, ns=(stat.st_atime_ns, stat.st_mtime_ns + 2 * 10**9))  # a later second than the bytecode's
    assert load_reward_fn("imported_first_mod:f")([""], ["x"]) == [1.0]
