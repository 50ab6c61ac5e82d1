"""Model-folder files: a corrupt config.json or a truncated safetensors file is a ModelError naming the file."""

import json
import shutil

import pytest

from rlkit.errors import ModelError
from rlkit.models import read_hf_config


@pytest.fixture
def folder(model_factory, tmp_path):
    """A private copy of the nano model folder, free to damage."""
    return shutil.copytree(model_factory("nano", "llama"), tmp_path / "model")


def test_intact_folder_reads(folder):
    assert read_hf_config(folder)["architectures"] == ["LlamaForCausalLM"]


def test_corrupt_config_json_names_the_file_and_the_line(folder):
    path = folder / "config.json"
    path.write_text(path.read_text()[:40])
    with pytest.raises(ModelError, match=r"model config '.*/model/config\.json' is not valid JSON \(line \d+"):
        read_hf_config(folder)


def test_config_json_that_is_a_list(folder):
    (folder / "config.json").write_text(json.dumps([1, 2]))
    with pytest.raises(ModelError, match=r"config\.json' holds a JSON list, not an object"):
        read_hf_config(folder)


def test_truncated_safetensors_is_found_from_the_header(folder):
    weights = folder / "model.safetensors"
    data = weights.read_bytes()
    weights.write_bytes(data[: len(data) // 2])
    with pytest.raises(ModelError) as info:
        read_hf_config(folder)
    assert f"weights file {str(weights)!r} is unreadable" in str(info.value)
    assert "incomplete metadata" in str(info.value) and "Fix:" in str(info.value)
    assert read_hf_config(folder, check_weights=False)["model_type"] == "llama"  # the config alone is fine


def test_shard_index_naming_a_missing_file(folder):
    index = {"metadata": {}, "weight_map": {"lm_head.weight": "model-00002-of-00002.safetensors"}}
    (folder / "model.safetensors.index.json").write_text(json.dumps(index))
    with pytest.raises(ModelError, match=r"missing weights file\(s\) \['model-00002-of-00002.safetensors'\]"):
        read_hf_config(folder)
