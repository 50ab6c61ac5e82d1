"""Gemma 3 (text) beyond the checks every family gets in tests/policy/test_families.py (logits over 400 positions,
past its 32-position window, export, vLLM after a step + refit, TP=2, negative controls): what rlkit refuses of it,
the window's mask against transformers' rule, the local RoPE base from any positions, the policy's own generator and
vLLM after a refit on rows past the window, and one `rlkit train` step from the command line."""

import json

import pytest
import torch

from rlkit.config.components import GenerationConfig, PolicyConfig
from rlkit.errors import ModelError
from rlkit.generation.base import SamplingSettings
from rlkit.models.factory import PRESET_WINDOW
from rlkit.policy.architecture import Architecture
from rlkit.policy.backends import in_process_policy
from tests.helpers import train_one_step_from_the_cli


@pytest.fixture(scope="module")
def gemma3(model_factory):
    return model_factory("nano", "gemma3", seed=1)


@pytest.mark.parametrize("change,reason", [
    ({"final_logit_softcapping": 30.0}, "soft-capping"),
    ({"attn_logit_softcapping": 50.0}, "soft-capping"),
    ({"use_bidirectional_attention": True}, "bidirectional"),
    ({"rope_parameters": {"full_attention": {"rope_type": "linear", "factor": 8.0, "rope_theta": 1e6},
                          "sliding_attention": {"rope_type": "default", "rope_theta": 1e4}}}, "RoPE scaling 'linear'"),
    ({"hidden_activation": "gelu"}, "hidden_activation='gelu'"),
    ({"layer_types": ["sliding_attention"]}, "layer_types"),
])
def test_what_rlkit_does_not_compute_is_refused_with_the_reason(gemma3, change, reason):
    config = json.loads((gemma3 / "config.json").read_text())
    assert Architecture.from_hf_config(config).sliding_window == PRESET_WINDOW  # the preset is accepted
    with pytest.raises(ModelError, match=reason):
        Architecture.from_hf_config(dict(config, **change))


def test_the_presets_have_local_and_global_layers_and_gemmas_scales(gemma3):
    from rlkit.models.factory import PRESETS, hf_config

    a = Architecture.from_hf_folder(gemma3)
    assert a.local_layers == (1, 0) and a.local_rope_theta == 1e4 and a.rope_theta == 1e6
    assert a.tie_word_embeddings and a.activation == "gelu_tanh" and a.softmax_scale == (2 * a.head_dim) ** -0.5
    for name, spec in PRESETS.items():  # every dense preset has both kinds of layer, one global in 6 from 6 layers on
        if not spec.num_experts:
            types = hf_config(spec, "gemma3").layer_types
            assert "full_attention" in types and "sliding_attention" in types, name
            assert types.count("full_attention") == (spec.num_hidden_layers // 6 or spec.num_hidden_layers // 2), name


@pytest.mark.parametrize("sq,skv", [(7, 7), (1, 7), (3, 7)])  # a whole sequence, one decode step, a chunk
def test_the_window_mask_is_transformers_rule(sq, skv):
    """Megatron's window (left, 0) = (sliding_window - 1, 0): query q sees key k where 0 <= q - k < sliding_window, as
    transformers' sliding-window mask; the last ``sq`` of ``skv`` positions are the queries (decoding with a cache)."""
    from rlkit.policy.megatron.cpu import sliding_window_mask_on_cpu

    window = 3
    masked = sliding_window_mask_on_cpu(sq, skv, (window - 1, 0))
    queries = range(skv - sq, skv)
    expected = torch.tensor([[not (0 <= q - k < window) for k in range(skv)] for q in queries])
    assert torch.equal(masked, expected)


def test_local_angles_are_the_local_bases_whatever_the_positions():
    """The local layers' RoPE angles from the global table, for 0..s-1 and for per-row positions (shared prompts,
    packed segments): those Megatron's RotaryEmbedding computes at the local base, to float rounding."""
    from megatron.core.models.common.embeddings.rotary_pos_embedding import RotaryEmbedding

    from rlkit.policy.megatron.cpu import apply_cpu_fallbacks
    from rlkit.policy.megatron.gemma import local_angles

    apply_cpu_fallbacks()
    glob, local = (RotaryEmbedding(kv_channels=32, rotary_percent=1.0, rotary_base=base) for base in (1e6, 1e4))
    inv_freq = local.inv_freq
    assert torch.allclose(local_angles(glob(600), inv_freq), local(600), rtol=1e-6, atol=1e-5)
    positions = torch.tensor([[5, 0, 599, 33], [1, 2, 3, 4]])  # [b, s] -> [s, b, 1, dim], as shared_prompt.rope_at
    per_token = glob(600)[:, 0, 0][positions.t()].unsqueeze(2)
    assert torch.allclose(local_angles(per_token, inv_freq), local(600)[:, 0, 0][positions.t()].unsqueeze(2),
                          rtol=1e-6, atol=1e-5)
    assert not torch.allclose(glob(600), local(600), atol=1e-2)  # the two bases differ where it matters


def test_the_policys_own_generator_samples_what_it_scores_past_the_window(gemma3):
    """policy.generation.backend=megatron on Gemma 3: a KV-cached decode through local layers (the window's mask for
    one query over the cache, the local base at each new position) gives the logprobs a full forward gives."""
    from tests.helpers import own_generator_matches_a_full_forward

    assert max(own_generator_matches_a_full_forward(gemma3)) > 2 * PRESET_WINDOW


def test_vllm_agrees_with_the_policy_past_the_window_after_a_step_and_refit(gemma3):
    """vLLM's Gemma 3 (its own model class, a per-layer window in its CPU attention) on rows more than twice the window
    long: the engine agrees with the policy, not after a policy step, and again after the refit."""
    from rlkit.weight_sync import ColocatedWeightSync
    from tests.helpers import agree_then_step, engine_beside_a_policy, generator_policy_mismatch

    policy, generator, _ = engine_beside_a_policy(gemma3)
    prompts = [list(range(3 + i, 43 + i)) for i in range(8)]  # 40 tokens each, then 24 sampled

    def mismatch(seed):
        return generator_policy_mismatch(generator, policy, [f"prompt {i}" for i in range(8)], prompts, seed)

    try:
        agree_then_step(policy, mismatch)
        ColocatedWeightSync().sync(policy, generator)
        diff, batch = mismatch(3)
        assert batch.attention_mask.sum(1).max() >= 2 * PRESET_WINDOW
        assert diff.max() < 1e-3 and diff.mean() < 1e-4
    finally:
        generator.close()
        policy.close()


def test_packed_rows_keep_the_window_within_each_row(gemma3, monkeypatch):
    """policy.sequence_packing: rows of 20-100 tokens packed into one sequence; each local layer's window applies per
    segment (Megatron's attention runs segment by segment), so the logprobs are the rows' own."""
    from rlkit.config.components import SequencePackingConfig
    from rlkit.policy.megatron import attention

    lengths = [90, 45, 70, 20, 100, 33]
    ids = torch.zeros(len(lengths), 100, dtype=torch.long)
    mask = torch.zeros_like(ids, dtype=torch.bool)
    for i, n in enumerate(lengths):
        ids[i, :n] = torch.randint(3, 100, (n,), generator=torch.Generator().manual_seed(i))
        mask[i, :n] = True
    calls, segments = [], attention.attend_per_segment
    monkeypatch.setattr(attention, "attend_per_segment", lambda *a, **k: calls.append(1) or segments(*a, **k))
    out = {}
    for packed in (False, True):
        policy = in_process_policy(PolicyConfig(model_name=str(gemma3),
                                                sequence_packing=SequencePackingConfig(enabled=packed)))
        try:
            out[packed] = policy.logprobs(ids, mask).logprobs
        finally:
            policy.close()
        assert bool(calls) == packed  # the packed pass ran segment by segment, the rows' pass did not
    assert (out[True] - out[False])[mask].abs().max() < 1e-6


def test_sdpa_attention_applies_the_window_as_megatrons_attention_does():
    """The CUDA core attention (:class:`SDPAttention`, run here on the CPU) in a local layer: the window's mask, as
    Megatron's unfused attention applies it; and not the causal mask alone (the window binds)."""
    from megatron.core.transformer.dot_product_attention import DotProductAttention
    from megatron.core.transformer.enums import AttnMaskType

    from rlkit.policy.megatron import parallel
    from rlkit.policy.megatron.attention import SDPAttention
    from rlkit.policy.megatron.build import transformer_config

    parallel.init_parallel(parallel.ParallelLayout(), seed=0)
    try:
        arch = Architecture(family="gemma3", hidden_size=128, num_layers=2, num_attention_heads=4, num_key_value_heads=2,
                            head_dim=32, ffn_hidden_size=256, vocab_size=64, max_position_embeddings=64,
                            rope_theta=1e6, rms_norm_eps=1e-6, tie_word_embeddings=True, qkv_bias=False,
                            qk_layernorm=True, gemma=True, activation="gelu_tanh", softmax_scale=0.1, sliding_window=8,
                            local_layers=(1, 0), local_rope_theta=1e4)
        config = transformer_config(arch)
        g = torch.Generator().manual_seed(0)
        q = torch.randn(40, 2, 4, 32, generator=g)
        k, v = (torch.randn(40, 2, 2, 32, generator=g) for _ in range(2))
        outs = {}
        for layer in (1, 2):  # local, global
            for cls in (DotProductAttention, SDPAttention):
                module = cls(config, layer_number=layer, attn_mask_type=AttnMaskType.causal, attention_type="self",
                             softmax_scale=config.softmax_scale)
                outs[layer, cls] = module(q, k, v, attention_mask=None)
        for layer in (1, 2):
            assert (outs[layer, SDPAttention] - outs[layer, DotProductAttention]).abs().max() < 5e-6
        assert (outs[1, SDPAttention] - outs[2, SDPAttention]).abs().max() > 1e-2  # the window binds in layer 1
    finally:
        parallel.destroy_parallel()
        parallel.release_process_group()


@pytest.fixture(scope="module")
def eos_heavy(tmp_path_factory):
    """A Gemma 3 folder with the BPE tokenizer's two EOS ids in generation_config.json (<|im_end|> 2, <|endoftext|>
    0), both given one (tied) embedding row, scaled up: a random model samples either often, equally likely."""
    from safetensors.torch import load_file, save_file

    from rlkit.models.factory import make_model

    folder = make_model(tmp_path_factory.mktemp("gemma3-eos"), "nano", "gemma3", seed=1, tokenizer="bpe")
    assert json.loads((folder / "generation_config.json").read_text())["eos_token_id"] == [2, 0]
    weights = load_file(str(folder / "model.safetensors"))
    embeddings = weights["model.embed_tokens.weight"]
    embeddings[[0, 2]] = 6 * embeddings[2]
    save_file(weights, str(folder / "model.safetensors"), metadata={"format": "pt"})
    return folder


def _stops_at_either_eos(out) -> None:
    ends = set()
    for tokens, reason in zip(out.token_ids, out.finish_reasons):
        assert not {0, 2} & set(tokens[:-1])  # no EOS id inside a completion
        if reason == "stop":
            ends.add(tokens[-1])
        else:
            assert tokens[-1] not in (0, 2)
    assert ends == {0, 2}  # stopped at each of the two ids


@pytest.mark.parametrize("engine", ["megatron", "vllm"])
def test_sampling_stops_at_both_eos_ids(eos_heavy, engine):
    sampling = SamplingSettings(max_new_tokens=24, seed=0)
    prompts = [list(range(10 + i, 50 + i)) for i in range(4)]
    if engine == "vllm":
        from rlkit.generation.vllm import VllmGenerator

        generator = VllmGenerator(eos_heavy, GenerationConfig(), max_model_len=128, seed=0)
        try:
            _stops_at_either_eos(generator.generate(prompts, 8, sampling))
        finally:
            generator.close()
        return
    policy = in_process_policy(PolicyConfig(model_name=str(eos_heavy)))
    try:
        _stops_at_either_eos(policy.adapter.own_generator(GenerationConfig(), 128, 0).generate(prompts, 8, sampling))
    finally:
        policy.close()


def test_rlkit_train_runs_a_step_on_a_gemma3_model_from_the_command_line(tmp_path):
    """quickstart_nano with policy.model_family=gemma3 (the model made from the preset) and room for sequences longer
    than the window: SFT, one GRPO step, vLLM refit, export."""
    train_one_step_from_the_cli(tmp_path, "Gemma3ForCausalLM", **{"policy.model_family": "gemma3",
                                                                   "policy.max_total_sequence_length": 56,
                                                                   "policy.generation.max_new_tokens": 36})
