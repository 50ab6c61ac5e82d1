import json

import pytest
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from rlkit.errors import ModelError
from rlkit.models import PRESETS, check_head_dim, make_model, read_hf_config
from rlkit.models.factory import count_parameters


def test_presets_span_half_to_fifty_million_parameters(model_factory):
    assert 0.4e6 < count_parameters(model_factory("tiny")) < 1.2e6
    assert all(s.head_dim in (32, 64) for s in PRESETS.values())
    # the largest preset by arithmetic, without writing 200 MB in a unit test
    spec = PRESETS["medium"]
    per_layer = 2 * spec.hidden_size**2 + 2 * spec.hidden_size * spec.num_key_value_heads * spec.head_dim
    per_layer += 3 * spec.hidden_size * spec.intermediate_size
    total = spec.num_hidden_layers * per_layer + 2 * spec.vocab_size * spec.hidden_size
    assert 40e6 < total < 55e6


@pytest.mark.parametrize("family", ["llama", "qwen2"])
def test_model_folder_loads_in_transformers_with_chat_template(model_factory, family):
    path = model_factory("nano", family)
    model = AutoModelForCausalLM.from_pretrained(str(path))
    tok = AutoTokenizer.from_pretrained(str(path))
    text = tok.apply_chat_template([{"role": "user", "content": "12+34"}], add_generation_prompt=True, tokenize=False)
    assert text == "<|bos|><|user|>12+34<|end|><|assistant|>"
    ids = tok(text, add_special_tokens=False)["input_ids"]
    assert len(ids) == 9 and tok.decode(ids[2:7]) == "12+34"
    assert len(tok) <= model.config.vocab_size
    with torch.no_grad():
        assert model(torch.tensor([ids])).logits.shape == (1, 9, model.config.vocab_size)
    if family == "qwen2":
        assert model.model.layers[0].self_attn.q_proj.bias.abs().sum() > 0  # biases are not trivially zero


def test_bad_head_dim_is_rejected_with_the_fix(tmp_path):
    with pytest.raises(ModelError, match="head_dim=16 .*Fix"):
        check_head_dim(16)
    with pytest.raises(ModelError, match="head_dim=16"):
        make_model(tmp_path / "m", "nano", num_attention_heads=4)


def test_the_engine_start_check_sizes_mla_by_its_latent_and_rope_key():
    """vLLM's CPU engine refuses at start what its kernels lack: the head size, or for MLA (a kv_lora_rank) the
    latent plus the RoPE key, whatever head_dim says (DeepSeek-V3's 512 + 64 runs; the tiny preset's 32 + 16 not)."""
    from rlkit.models.factory import vllm_cpu_refusal

    mla = {"num_attention_heads": 4, "hidden_size": 64, "head_dim": 64, "kv_lora_rank": 32, "qk_rope_head_dim": 16}
    assert "kv_lora_rank + qk_rope_head_dim=48" in vllm_cpu_refusal(mla) and "backend=hf" in vllm_cpu_refusal(mla)
    assert vllm_cpu_refusal({**mla, "kv_lora_rank": 512, "qk_rope_head_dim": 64, "head_dim": 24}) is None
    assert vllm_cpu_refusal({"num_attention_heads": 4, "hidden_size": 64}) is not None  # head_dim 16
    assert vllm_cpu_refusal({"num_attention_heads": 2, "hidden_size": 64}) is None  # head_dim 32


def test_missing_folder_and_unsupported_architecture(tmp_path):
    with pytest.raises(ModelError, match="does not exist.*rlkit make-model"):
        read_hf_config(tmp_path / "nowhere")
    (tmp_path / "gpt2").mkdir()
    (tmp_path / "gpt2" / "config.json").write_text(json.dumps({"architectures": ["GPT2LMHeadModel"]}))
    with pytest.raises(ModelError, match="GPT2LMHeadModel.*not supported.*LlamaForCausalLM"):
        read_hf_config(tmp_path / "gpt2")
