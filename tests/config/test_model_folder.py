"""The default model folder follows the preset, so two presets never share (and silently reuse) one folder."""

import warnings

from rlkit.config.components import PolicyConfig, default_model_folder
from rlkit.config.loading import load_config


def test_two_presets_get_two_folders(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)  # the default folder is relative to the working directory
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # no "already holds a different model" warning either
        tiny = load_config("quickstart").policy
        nano = load_config("quickstart", {"policy.model_preset": "nano"}).policy
    assert (tiny.model_name, nano.model_name) == ("models/tiny-llama", "models/nano-llama")
    assert load_config("quickstart", {"policy.model_family": "qwen2"}).policy.model_name == "models/tiny-qwen2"


def test_an_explicit_folder_is_kept_and_null_means_the_default(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    assert load_config("quickstart", {"policy.model_name": "mine", "policy.model_preset": "nano"}).policy.model_name == "mine"
    assert load_config("quickstart", ["policy.model_name=null", "policy.model_preset=nano"]).policy.model_name == \
        "models/nano-llama"
    assert PolicyConfig(model_preset="small", model_family="qwen2").model_name == "models/small-qwen2"
    assert PolicyConfig().model_name == default_model_folder(None, "llama") == "models/tiny"
