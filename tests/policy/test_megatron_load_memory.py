"""The Megatron policy's load writes each weight once: Megatron's own initialisation is off for a model whose weights
all come from the folder. On the CPU that initialisation writes every weight through an fp32 temporary of its full
size (``_initialize_affine_weight_cpu``), and at the Qwen3-0.6B shape with adapters at bf16 the pages it touched
held 1.4 GB of glibc heap after the load and 0.9 GB more at its peak (docs/measurements.md, issue 50).

Megatron also marks the tensor-parallel weights (``tensor_model_parallel``, ``partition_dim``, ``partition_stride``)
inside that initialisation; the build marks them itself when it is off (:func:`.build.mark_tensor_parallel_weights`),
or the gradient norm under TP counts each shard as a replica (qwen3-nano at TP=2: 2.19 against 2.93 in one process).
"""

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


TP_ATTRIBUTES = ("tensor_model_parallel", "partition_dim", "partition_stride")
# every family tests/policy/test_families*.py builds: dense, Qwen MoE (routed and shared experts), DeepSeek-V3's latent
# attention, GPT-OSS's sinks and biased experts
BUILT_FAMILIES = [("llama3", "nano"), ("qwen3", "nano"), ("qwen3-moe", "nano-moe"), ("qwen2-moe", "nano-moe"),
                  ("mistral", "nano"), ("phi3", "nano"), ("smollm3", "nano"), ("olmo2", "nano"), ("gemma3", "nano"),
                  ("deepseek-v3", "nano-moe"), ("gpt-oss", "nano-moe")]


@pytest.fixture(scope="module")
def megatron_state():
    from rlkit.policy.megatron import parallel

    parallel.init_parallel(parallel.ParallelLayout(), seed=0)
    yield
    parallel.destroy_parallel()
    parallel.release_process_group()


def _tp_attributes(folder, preset: str, initialize: bool) -> dict:
    """Each parameter's tensor-parallel attributes (None where unset) in a model built as the policy builds it."""
    from rlkit.config.backends import MegatronConfig
    from rlkit.policy.architecture import Architecture
    from rlkit.policy.megatron import moe
    from rlkit.policy.megatron.build import build_gpt_model, transformer_config

    if preset.endswith("moe"):
        model = moe.build_moe_gpt_model(moe.MoEArchitecture.from_hf_folder(folder), 1, 1, MegatronConfig(),
                                        initialize=initialize)
    else:
        arch = Architecture.from_hf_folder(folder)
        model = build_gpt_model(arch, transformer_config(arch, initialize=initialize))
    return {name: tuple(getattr(p, a, None) for a in TP_ATTRIBUTES) for name, p in model.named_parameters()}


@pytest.mark.parametrize("family,preset", BUILT_FAMILIES)
def test_a_build_without_initialisation_marks_the_same_tensor_parallel_weights(model_factory, megatron_state,
                                                                               family, preset):
    """Megatron sets the attributes at any TP size, so one process shows them all."""
    folder = model_factory(preset, family, seed=1)
    initialised = _tp_attributes(folder, preset, initialize=True)
    assert sum(attrs[0] is True for attrs in initialised.values()) >= 4  # embedding, qkv, proj, fc1, fc2, ...
    assert _tp_attributes(folder, preset, initialize=False) == initialised
