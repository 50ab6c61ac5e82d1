"""Bad YAML, in a file or in an override value, is a ConfigError naming the file (or override) and the line."""

import pytest

from rlkit.config.loading import load_config
from rlkit.errors import ConfigError


def only_problem(source, overrides=()):
    with pytest.raises(ConfigError) as info:
        load_config(source, overrides)
    (problem,) = info.value.problems
    return problem


def test_syntax_error_names_the_file_line_and_reason(tmp_path):
    path = tmp_path / "run.yaml"
    path.write_text("base: quickstart\ngrpo:\n  num_prompts_per_step: 8\n  advantage_estimator: grpo: rloo\n")
    assert only_problem(str(path)).startswith(
        f"config file {str(path)!r} is not valid YAML at line 4, column 28: mapping values are not allowed here. Fix:"
    )


def test_unclosed_bracket(tmp_path):
    path = tmp_path / "run.yaml"
    path.write_text("grpo: {num_prompts_per_step: 8\n")
    assert f"config file {str(path)!r} is not valid YAML at line 2" in only_problem(str(path))


@pytest.mark.parametrize("text, kind", [("- grpo\n- sft\n", "list"), ("8\n", "int"), ("quickstart\n", "str")])
def test_a_file_that_is_not_a_mapping(tmp_path, text, kind):
    path = tmp_path / "run.yaml"
    path.write_text(text)
    assert only_problem(str(path)).startswith(f"config file {str(path)!r} holds a YAML {kind}, not a mapping of sections")


def test_a_file_that_is_not_utf8(tmp_path):
    path = tmp_path / "run.yaml"
    path.write_bytes(b"name: caf\xe9\n")
    assert only_problem(str(path)).startswith(f"config file {str(path)!r} is not UTF-8 text")


def test_a_base_that_is_not_a_name(tmp_path):
    path = tmp_path / "run.yaml"
    path.write_text("base: [quickstart]\n")
    assert only_problem(str(path)) == f"config file {str(path)!r}: base=['quickstart'] must name a preset or a YAML file"


def test_broken_yaml_in_an_override_value_names_the_override():
    problem = only_problem("quickstart", ['policy.generation.stop_strings=["\\n"', "grpo.num_epochs=2"])
    assert problem.startswith("override 'policy.generation.stop_strings=[\"\\\\n\"': the value is not valid YAML at "
                              "line 1, column 6: expected ',' or ']'")
