"""HF -> Megatron conversion checked against transformers' own forward pass (fp32, max abs 1e-4)."""

import pytest
import torch
from transformers import AutoModelForCausalLM

from rlkit.config.components import PolicyConfig
from rlkit.policy.megatron import convert
from rlkit.policy.megatron.policy import MegatronPolicy, load_hf_state

TOL = 1e-4


@pytest.fixture
def policy_for(model_factory):
    made = []

    def build(family, tie):
        path = model_factory("tiny", family, seed=1, tie_word_embeddings=tie)
        made.append(MegatronPolicy(PolicyConfig(model_name=str(path))))
        return made[-1], path

    yield build
    for p in made:
        p.close()


def hf_and_megatron_logits(policy, path, ids):
    hf = AutoModelForCausalLM.from_pretrained(str(path), dtype=torch.float32).eval()
    policy.model.eval()
    with torch.no_grad():
        return hf(ids).logits, policy.adapter.logits(ids)


@pytest.mark.parametrize("family,tie", [("llama", False), ("llama", True), ("qwen2", False)])
def test_logits_match_transformers_and_export_round_trips(policy_for, family, tie):
    policy, path = policy_for(family, tie)
    ids = torch.randint(3, 100, (3, 48), generator=torch.Generator().manual_seed(0))
    ref, out = hf_and_megatron_logits(policy, path, ids)
    assert (ref - out).abs().max().item() < TOL
    original = load_hf_state(path)
    exported = policy.hf_state_dict()
    assert set(exported) == set(original)
    for name, tensor in original.items():
        assert torch.equal(exported[name], tensor), name


@pytest.mark.parametrize("wrong", ["plain_qkv", "swapped_gate_up"])
def test_a_wrong_mapping_fails_the_same_check(policy_for, monkeypatch, wrong):
    if wrong == "plain_qkv":
        monkeypatch.setattr(convert, "fuse_qkv", lambda q, k, v, arch: torch.cat([q, k, v]))
    else:
        real = convert.hf_layer_to_megatron

        def swapped(hf, i, arch):
            out = real(hf, i, arch)
            key = f"decoder.layers.{i}.mlp.linear_fc1.weight"
            gate, up = torch.chunk(out[key], 2)
            out[key] = torch.cat([up, gate])
            return out

        monkeypatch.setattr(convert, "hf_layer_to_megatron", swapped)
    policy, path = policy_for("llama", False)
    ids = torch.randint(3, 100, (3, 48), generator=torch.Generator().manual_seed(0))
    ref, out = hf_and_megatron_logits(policy, path, ids)
    assert (ref - out).abs().max().item() > 100 * TOL


def test_tensor_parallel_shard_and_unshard_are_inverse():
    full = {
        "decoder.layers.0.mlp.linear_fc1.weight": torch.arange(48.0).reshape(8, 6),
        "decoder.layers.0.self_attention.linear_proj.weight": torch.arange(24.0).reshape(4, 6),
        "decoder.layers.0.input_layernorm.weight": torch.arange(6.0),
    }
    for name, tensor in full.items():
        pieces = [convert.shard(name, tensor, r, 2) for r in range(2)]
        assert torch.equal(convert.unshard(name, pieces), tensor)
    fc1 = [convert.shard("x.linear_fc1.weight", full["decoder.layers.0.mlp.linear_fc1.weight"], r, 2) for r in range(2)]
    # rank 0 holds [gate rows 0-1; up rows 4-5], not the first half of the fused tensor
    assert fc1[0][:, 0].tolist() == [0.0, 6.0, 24.0, 30.0]
