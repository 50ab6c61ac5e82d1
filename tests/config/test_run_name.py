"""Run names are folder names under logger.log_dir, not paths; the folders themselves may be anywhere."""

import pytest

from rlkit.config.loading import load_config
from rlkit.errors import ConfigError


@pytest.mark.parametrize(
    "name, fix",
    [
        ("../../x", "Fix: name='x', and choose the folder with logger.log_dir='..'"),
        ("/abs/x", "Fix: name='x', and choose the folder with logger.log_dir='/abs'"),
        ("team/x", "Fix: name='x', and choose the folder with logger.log_dir='runs/team'"),
        ("team\\x", "Fix: name='x', and choose the folder with logger.log_dir='runs/team'"),
        ("..", "Fix: name=my_run"),
        ("", "Fix: name=my_run"),
    ],
)
def test_path_like_names_are_rejected_naming_the_key_and_the_fix(name, fix):
    with pytest.raises(ConfigError) as info:
        load_config("quickstart", {"name": name})
    (problem,) = [p for p in info.value.problems if p.startswith("name=")]
    assert problem.startswith(f"name={name!r}: ") and problem.endswith(fix)


def test_name_problem_is_reported_with_the_others():
    with pytest.raises(ConfigError) as info:
        load_config("quickstart", {"name": "../x", "grpo.num_prompts_per_step": 0})
    assert any(p.startswith("name='../x'") for p in info.value.problems)
    assert any(p.startswith("grpo.num_prompts_per_step") for p in info.value.problems)


def test_plain_names_and_any_folders_pass(tmp_path):
    config = load_config("quickstart", {"name": "exp-1_lr=1e-4.v2", "logger.log_dir": str(tmp_path / ".." / "logs"),
                                        "checkpointing.checkpoint_dir": "/tmp/elsewhere/ckpt"})
    assert config.name == "exp-1_lr=1e-4.v2" and config.checkpointing.checkpoint_dir == "/tmp/elsewhere/ckpt"
