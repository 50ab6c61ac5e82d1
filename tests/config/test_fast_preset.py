"""quickstart_nano, the fast recipe for notebooks: its defaults fit together (no problem, no warning)."""

import warnings

from rlkit.config.loading import load_config
from rlkit.data import load_prompt_dataset
from rlkit.data.chat import render_prompts
from rlkit.envs.arithmetic import count_arithmetic_prompts
from rlkit.models.tokenizer import build_char_tokenizer


def test_quickstart_nano_loads_without_problems_or_warnings(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        config = load_config("quickstart_nano")
    assert (config.policy.model_preset, config.data.digits) == ("nano", 1)
    assert config.policy.model_name == "models/nano-llama"
    assert config.data.num_validation < count_arithmetic_prompts(1)  # leaves prompts to train on
    assert config.eval.num_prompts <= config.data.num_validation


def test_quickstart_nano_prompts_and_answers_fit_its_lengths():
    config = load_config("quickstart_nano")
    data = load_prompt_dataset(config.data)
    tok = build_char_tokenizer()
    longest_prompt = max(len(ids) for ids in render_prompts(tok, list(data["train"]["prompt"])))
    assert longest_prompt <= config.policy.max_prompt_tokens
    longest_answer = max(len(tok(a, add_special_tokens=False)["input_ids"]) for a in data["train"]["answer"]) + 1  # + end
    assert longest_answer <= config.policy.generation.max_new_tokens
    assert len(data["train"]) == config.data.num_train and len(data["validation"]) == config.data.num_validation


def test_quickstart_nano_answers_have_room_for_a_4_letter_word():
    """4 answer tokens cut every 4-letter answer of a task of your own (the word and its end token need 5)."""
    config = load_config("quickstart_nano")
    tok = build_char_tokenizer()
    assert len(tok("word", add_special_tokens=False)["input_ids"]) + 1 <= config.policy.generation.max_new_tokens
    assert config.policy.max_prompt_tokens >= 20  # the prompt budget did not shrink to make room
