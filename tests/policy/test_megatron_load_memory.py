"""The Megatron policy's load writes each weight once: Megatron's own initialisation is off for a model whose weights
all come from the folder. On the CPU that initialisation writes every weight through an fp32 temporary of its full
size (``_initialize_affine_weight_cpu``), and at the Qwen3-0.6B shape with adapters at bf16 the pages it touched
held 1.4 GB of glibc heap after the load and 0.9 GB more at its peak (docs/measurements.md, issue 50)."""

import pytest
import torch
from megatron.core.tensor_parallel import layers

from rlkit.config.components import PolicyConfig
from rlkit.policy.backends import in_process_policy
from tests.policy.test_lora import lora_cfg


@pytest.fixture
def initialisations(monkeypatch):
    """The weights Megatron initialises on the CPU, by shape, while the fixture lives."""
    calls = []
    original = layers._initialize_affine_weight_cpu

    def counted(weight, *args, **kwargs):
        calls.append(tuple(weight.shape))
        return original(weight, *args, **kwargs)

    monkeypatch.setattr(layers, "_initialize_affine_weight_cpu", counted)
    return calls


@pytest.mark.parametrize("lora,precision", [(False, "float32"), (True, "bfloat16")])
def test_the_load_runs_no_megatron_initialisation(model_factory, initialisations, lora, precision):
    from transformers import AutoModelForCausalLM

    from rlkit.policy.architecture import Architecture
    from rlkit.policy.megatron.build import build_gpt_model, transformer_config

    path = model_factory("nano", "qwen3", seed=3, tie_word_embeddings=True)
    cfg = lora_cfg(path, "megatron", precision) if lora else PolicyConfig(
        model_name=str(path), train_micro_batch_size=4, precision=precision)
    policy = in_process_policy(cfg)
    try:
        assert initialisations == []
        arch = Architecture.from_hf_folder(str(path))
        build_gpt_model(arch, transformer_config(arch))  # (after the policy: it set up Megatron's process groups)
        assert initialisations, "the hook sees Megatron's initialisation of a model built with the defaults"
        # and every weight is the folder's (the strict load covers them all): the same logits as transformers
        ids = torch.randint(0, 32, (2, 12))
        ours = policy.adapter.logits(ids)
        hf = AutoModelForCausalLM.from_pretrained(str(path), torch_dtype=torch.float32).eval()
        with torch.no_grad():
            theirs = hf(ids).logits
        assert (ours.float() - theirs).abs().max() < (5e-2 if precision == "bfloat16" else 1e-4)
    finally:
        policy.close()
