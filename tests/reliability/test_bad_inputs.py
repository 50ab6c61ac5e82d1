"""Catalogue of bad inputs: each gets its exact error class and a message that names the input.

One test per input a user hands rlkit (a config value, a YAML file or override, a run name, a model folder's
config.json and weights, a dataset file, a reward function). Each checks ``type(error) is`` the class, so a
refactor that turns one of them into a bare ``ValueError`` or a parser traceback fails here. All are fast:
no engine starts; files are damaged copies in ``tmp_path``.
"""

import json
import shutil

import pytest
import torch

from rlkit.config.loading import load_config
from rlkit.data import load_prompt_dataset
from rlkit.envs import RewardFunctionEnvironment
from rlkit.errors import ConfigError, DataError, ModelError, RewardError
from rlkit.models import read_hf_config
from rlkit.models.tokenizer import build_char_tokenizer
from rlkit.stages import score
from rlkit.trajectories import Trajectories


def raised(cls, fn, *args, **kwargs):
    """The error ``fn`` raised, checked to be exactly ``cls`` (not a subclass, not a parent)."""
    with pytest.raises(Exception) as info:
        fn(*args, **kwargs)
    assert type(info.value) is cls, f"{type(info.value).__name__}: {info.value}"
    return str(info.value)


@pytest.fixture
def model(model_factory, tmp_path):
    return shutil.copytree(model_factory("nano", "llama"), tmp_path / "model")


# ---- config ----------------------------------------------------------------------------------------------
def test_config_value_out_of_range_names_the_key():
    msg = raised(ConfigError, load_config, "quickstart", {"env.max_reward_failure_fraction": 2})
    assert "env.max_reward_failure_fraction" in msg


def test_yaml_syntax_error_names_the_file_and_line(tmp_path):
    path = tmp_path / "run.yaml"
    path.write_text("grpo:\n  num_prompts_per_step: [8\n")
    msg = raised(ConfigError, load_config, str(path))
    assert f"config file {str(path)!r} is not valid YAML at line 3" in msg


def test_yaml_file_that_is_a_list_names_the_file(tmp_path):
    path = tmp_path / "run.yaml"
    path.write_text("- grpo\n")
    assert f"config file {str(path)!r} holds a YAML list" in raised(ConfigError, load_config, str(path))


def test_broken_yaml_override_names_the_override():
    msg = raised(ConfigError, load_config, "quickstart", ["policy.generation.stop_strings=[a"])
    assert "override 'policy.generation.stop_strings=[a': the value is not valid YAML" in msg


def test_run_name_that_is_a_path_names_the_key():
    msg = raised(ConfigError, load_config, "quickstart", {"name": "../../x"})
    assert "name='../../x': a run name is one folder name under logger.log_dir" in msg


# ---- model folder ----------------------------------------------------------------------------------------
def test_corrupt_config_json_names_the_file(model):
    (model / "config.json").write_text("{")
    assert f"{str(model / 'config.json')!r} is not valid JSON" in raised(ModelError, read_hf_config, model)
    msg = raised(ConfigError, load_config, "quickstart", {"policy.model_name": str(model), "policy.model_preset": None})
    assert f"{str(model / 'config.json')!r} is not valid JSON" in msg


def test_truncated_safetensors_names_the_file(model):
    weights = model / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[:-64])
    assert f"weights file {str(weights)!r} is unreadable" in raised(ModelError, read_hf_config, model)


@pytest.mark.skipif(torch.cuda.is_available(), reason="vLLM's CPU head sizes")
def test_head_dim_vllm_cpu_cannot_run_names_the_model(model):
    config = json.loads((model / "config.json").read_text())
    (model / "config.json").write_text(json.dumps(dict(config, num_attention_heads=4, head_dim=16)))
    # a setting only vLLM honours (else validation switches to backend=hf: tests/config/test_generation_fallback.py)
    msg = raised(ConfigError, load_config, "quickstart", {"policy.model_name": str(model), "policy.model_preset": None,
                                                          "policy.generation.vllm_cfg.precision": "bfloat16"})
    assert f"policy.model_name={str(model)!r}: head_dim=16" in msg


# ---- dataset files ---------------------------------------------------------------------------------------
def test_non_utf8_jsonl_names_the_file(tmp_path):
    path = tmp_path / "data.jsonl"
    path.write_bytes(b'{"prompt": "caf\xe9"}\n')
    assert f"data.path: {str(path)!r} is not UTF-8 text" in raised(DataError, load_prompt_dataset, str(path))


def test_empty_parquet_names_the_file(tmp_path):
    from datasets import Dataset

    path = tmp_path / "data.parquet"
    Dataset.from_dict({"prompt": []}).to_parquet(str(path))
    assert f"data.path: {str(path)!r} is a parquet file with no rows" in raised(DataError, load_prompt_dataset, str(path))


def test_overlong_prompt_names_the_file_and_row(tmp_path):
    path = tmp_path / "data.jsonl"
    path.write_text('{"prompt": "1+1"}\n{"prompt": "' + "9" * 50 + '"}\n')
    msg = raised(DataError, load_prompt_dataset, {"path": str(path), "overlong_prompts": "error"},
                 build_char_tokenizer(), 20)
    assert f"{str(path)!r} line 2 renders" in msg


# ---- reward function -------------------------------------------------------------------------------------
def test_reward_failing_on_every_sample_names_the_function_and_the_exception():
    def my_reward(prompts, completions, **_):
        return [float(c == answr) for c in completions]  # noqa: F821 - the typo under test

    b = 2
    batch = Trajectories(
        prompts=("1+1=", "2+2="), completions=("2", "4"), input_ids=torch.zeros(b, 3, dtype=torch.long),
        attention_mask=torch.ones(b, 3, dtype=torch.bool), loss_mask=torch.ones(b, 3, dtype=torch.bool),
        generator_logprobs=torch.zeros(b, 3), finish_reasons=("stop",) * b, group_size=1, policy_version=0,
        rows=({"prompt": "1+1="}, {"prompt": "2+2="}),
    )
    msg = raised(RewardError, score, batch, RewardFunctionEnvironment(my_reward))
    assert "'my_reward'" in msg and "NameError: name 'answr' is not defined" in msg


# ---- stage order ---------------------------------------------------------------------------------------------
@pytest.mark.parametrize("missing,stage", [("advantages", "advantages()"), ("prev_logprobs", "logprobs()")])
def test_a_stage_before_its_input_names_the_stage_to_run_first(missing, stage):
    """train() on a batch that lacks what an earlier stage fills (a closed session's refusals are in
    tests/session/test_close.py: that one needs a session)."""
    from rlkit.errors import StageOrderError
    from rlkit.stages import train
    from tests.helpers import pg_token_mean_loss, random_batch

    batch = random_batch(b=4, t=12)
    batch = batch.with_(prev_logprobs=torch.zeros(4, 12)) if missing == "advantages" else batch
    batch = batch.with_(advantages=None) if missing == "advantages" else batch
    msg = raised(StageOrderError, train, batch, policy=None, loss_fn=pg_token_mean_loss)
    assert missing in msg and stage in msg


def test_a_huge_prompt_is_dropped_by_its_length_in_characters_without_tokenizing(tmp_path, monkeypatch):
    """One 50 MB prompt took 140 s and 18 GB to render and tokenize before it was dropped: a text longer than the
    prompt budget times the longest token (in characters) is over-long without tokenizing (here 1 MB)."""
    import time

    import rlkit.data.lengths as lengths

    seen = []
    measure = lengths.prompt_token_lengths
    monkeypatch.setattr(lengths, "prompt_token_lengths", lambda tok, prompts, system=None, template_kwargs=None,
                        tools=None: (seen.extend(len(p) for p in prompts), measure(tok, prompts, system,
                                                                                    template_kwargs, tools))[1])
    path = tmp_path / "data.jsonl"
    path.write_text('{"prompt": "1+1"}\n{"prompt": "' + "9" * 1_000_000 + '"}\n{"prompt": "2+2"}\n')
    tok = build_char_tokenizer()
    t0 = time.perf_counter()
    with pytest.warns(UserWarning) as record:
        ds = load_prompt_dataset({"path": str(path), "validation_path": str(path)}, tok, 20)
    assert time.perf_counter() - t0 < 10
    assert seen and max(seen) == 3 and ds["train"]["prompt"] == ["1+1", "2+2"]
    chars = lengths.max_token_chars(tok)
    assert (f"data: dropped 1 of 3 prompt(s) in {str(path)!r} longer than the 20 tokens a rollout can take (the "
            f"engine's max_model_len minus policy.generation.max_new_tokens); first: line 2 (1000000 characters, "
            f"more than 20 tokens of at most {chars} characters each hold, so not tokenized, ") in str(record[0].message)
    msg = raised(DataError, load_prompt_dataset, {"path": str(path), "overlong_prompts": "error"}, tok, 20)
    assert f"{str(path)!r} line 2 has 1000000 characters, more than 20 tokens of at most {chars} characters" in msg


def test_empty_prompts_are_dropped_with_a_warning_that_counts_them(tmp_path):
    path = tmp_path / "data.jsonl"
    path.write_text("".join('{"prompt": "%s", "answer": "1"}\n' % p for p in ["1+0", "", "2+0", "  ", "3+0", "4+0"]))
    with pytest.warns(UserWarning) as record:
        ds = load_prompt_dataset({"path": str(path), "validation_path": str(path)})
    assert ds["train"]["prompt"] == ["1+0", "2+0", "3+0", "4+0"]
    assert str(record[0].message) == (
        f"data: dropped 2 of 6 prompt(s) in {str(path)!r} that are empty or only whitespace; first: line 2. "
        "Fix: remove those rows (or fill in their prompts)")


def test_a_007_answer_stays_the_text_007_through_a_named_dataset(tmp_path):
    """datasets' JSON builder stores a column of mixed types as its Json feature and reads "007" back as 7."""
    folder = tmp_path / "ds"
    folder.mkdir()
    rows = [{"prompt": "bond", "answer": "007"}, {"prompt": "dozen", "answer": 12},
            {"prompt": "greet", "answer": 'say "hi"'}, {"prompt": "sci", "answer": "1e3"}]
    (folder / "train.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    (folder / "test.jsonl").write_text(json.dumps({"prompt": "held out", "answer": "0"}) + "\n")
    ds = load_prompt_dataset({"dataset_name": str(folder), "validation_split": "test"})
    assert ds["train"]["answer"] == ["007", "12", 'say "hi"', "1e3"]
    assert ds["train"].column_names == ["prompt", "answer"]


def test_a_tokenizer_larger_than_the_models_vocabulary_is_refused_before_the_engines_start(model, monkeypatch):
    """Was a bare IndexError from the first forward, after both engines had started."""
    from transformers import AutoTokenizer

    import rlkit
    from rlkit import builders

    tok = AutoTokenizer.from_pretrained(model)
    vocab = json.loads((model / "config.json").read_text())["vocab_size"]
    tok.add_tokens([f"<extra_{i}>" for i in range(vocab - len(tok) + 5)])
    tok.save_pretrained(model)
    started = []
    monkeypatch.setattr(builders, "build_policy", lambda *a, **k: started.append("policy"))
    monkeypatch.setattr(builders, "build_generation", lambda *a, **k: started.append("generator"))
    cfg = load_config("quickstart_nano", {"policy.model_name": str(model), "policy.model_preset": None})
    msg = raised(ModelError, rlkit.Session, cfg)
    assert started == []
    assert msg == (f"the tokenizer of {str(model)!r} has {vocab + 5} tokens (ids 0-{vocab + 4}) but the model's "
                   f"vocabulary (config.json vocab_size) has {vocab} rows, so ids {vocab}-{vocab + 4} would index past "
                   "its embedding. Fix: use the tokenizer the model was made with; or, after adding tokens, resize the "
                   "embeddings (model.resize_token_embeddings(len(tokenizer))) and save the model and tokenizer together")
