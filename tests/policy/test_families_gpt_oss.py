"""GPT-OSS through the Megatron policy (rlkit.policy.megatron.gpt_oss): learnable attention sinks, sliding-window and full
layers alternating, YaRN RoPE, biases on attention, router and experts (stored stacked), the clamped SwiGLU.

Against independent references (fp32): the policy's logits and token logprobs vs transformers' own eager model over 400
positions, past the preset's 32-position window (bound 1e-4), the export exact, YaRN's frequencies vs transformers'
own, the exported folder after a step read back by transformers (1e-4), the generator after a train step + refit
(1e-3), sampling stopping at both EOS ids, one `rlkit train` step. Each knob has a negative control that misses by
> 100x the bound. Slow suite: EP=2 against one process within 1e-5 (test_families.py's layout test).
"""

import dataclasses
import json
import shutil

import pytest
import torch
from transformers import AutoModelForCausalLM

from rlkit.config.components import GenerationConfig, OptimizerConfig, PolicyConfig
from rlkit.errors import ModelError
from rlkit.generation.base import SamplingSettings
from rlkit.models.compare import logits_agreement
from rlkit.models.factory import PRESET_WINDOW
from rlkit.policy.architecture import load_hf_state
from rlkit.policy.backends import in_process_policy
from rlkit.policy.megatron import gpt_oss, moe
from tests.helpers import (own_generator_matches_a_full_forward, agree_then_step, arithmetic_prompts, generator_policy_mismatch, pg_token_mean_loss,
                           random_batch, train_one_step_from_the_cli)

TOL = 1e-4
IDS = torch.randint(3, 100, (2, 400), generator=torch.Generator().manual_seed(0))


@pytest.fixture(scope="module")
def path(model_factory):
    return model_factory("nano-moe", "gpt-oss", seed=1)


def token_logprobs(logits: torch.Tensor, ids: torch.Tensor) -> torch.Tensor:
    """Logprobs [b, s-1] of each next token under ``logits`` [b, s, v]."""
    return torch.log_softmax(logits[:, :-1].float(), -1).gather(-1, ids[:, 1:, None])[..., 0]


def transformers_logits(path) -> torch.Tensor:
    hf = AutoModelForCausalLM.from_pretrained(str(path), dtype=torch.float32, attn_implementation="eager").eval()
    with torch.no_grad():
        return hf(IDS).logits


def agreement_with_transformers(path, policy=None):
    """The policy's logits against transformers' fp32 eager forward, and the largest token-logprob difference."""
    theirs = transformers_logits(path)
    own = policy is None
    policy = policy or in_process_policy(PolicyConfig(model_name=str(path)))
    try:
        policy.model.eval()
        with torch.no_grad():
            ours = policy.adapter.logits(IDS)
        diff = (token_logprobs(ours, IDS) - token_logprobs(theirs, IDS)).abs().max().item()
        return logits_agreement(ours, theirs), diff
    finally:
        if own:
            policy.close()


def test_logits_match_transformers_past_the_window_and_export_round_trips(path):
    policy = in_process_policy(PolicyConfig(model_name=str(path)))
    try:
        arch = policy.adapter.arch
        assert isinstance(policy.adapter, moe.MegatronMoEAdapter) and arch.attention_sinks and arch.linear_bias
        assert arch.local_layers == (1, 0) and arch.sliding_window == PRESET_WINDOW and arch.yarn[0] == 8.0
        attention = policy.model.decoder.layers[0].self_attention
        assert attention.core_attention.softmax_offset.abs().min() > 0  # the checkpoint's (jittered) sinks, loaded
        agreement, logprob_diff = agreement_with_transformers(path, policy)
        assert agreement.ok and agreement.bound <= TOL and logprob_diff < TOL, (agreement, logprob_diff)
        original, exported = load_hf_state(path), policy.hf_state_dict()
        assert set(exported) == set(original) and all(torch.equal(exported[k], original[k]) for k in original)
    finally:
        policy.close()


def test_yarn_frequencies_are_transformers_own(path):
    """:func:`gpt_oss.yarn_inv_freq` and the attention factor vs transformers' YaRN for the preset and for truncation."""
    from transformers import AutoConfig
    from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

    config = AutoConfig.from_pretrained(str(path))
    for truncate in (False, True):
        config.rope_parameters = dict(config.rope_parameters, truncate=truncate)
        theirs, factor = ROPE_INIT_FUNCTIONS["yarn"](config, "cpu")
        ours = gpt_oss.yarn_inv_freq(config.head_dim, 150000.0, 8.0, 64, 32.0, 1.0, truncate)
        assert torch.allclose(ours, theirs, rtol=1e-6, atol=0) and gpt_oss.yarn_attention_factor(8.0) == factor
    plain = 1.0 / 150000.0 ** (torch.arange(0, config.head_dim, 2) / config.head_dim)
    assert (ours / plain).min() < 0.2  # the slow frequencies interpolated: YaRN changes the angles


def _arch_changed(monkeypatch, **changes):
    real = moe.build_moe_gpt_model
    monkeypatch.setattr(moe, "build_moe_gpt_model",
                        lambda arch, *a, **k: real(dataclasses.replace(arch, **changes), *a, **k))


def _after_loading(monkeypatch, suffixes: tuple[str, ...], value: float):
    """Load the checkpoint, then fill the parameters whose names end with ``suffixes`` with ``value``."""
    real = moe.MegatronMoEAdapter.copy_hf_state

    def load_then_fill(self, hf):
        real(self, hf)
        with torch.no_grad():
            for name, param in self.model.named_parameters():
                if name.endswith(suffixes):
                    param.fill_(value)

    monkeypatch.setattr(moe.MegatronMoEAdapter, "copy_hf_state", load_then_fill)


def _gate_up_read_in_halves(monkeypatch):
    """The stacked gate_up read as [gate | up] halves, as the other families' fused fc1, not interleaved."""
    real = gpt_oss.experts_to_megatron

    def halves(hf, i, num_experts):
        out = real(hf, i, num_experts)
        gate_up = hf[f"model.layers.{i}.mlp.experts.gate_up_proj"]
        for e in range(num_experts):
            out[f"decoder.layers.{i}.mlp.experts.local_experts.{e}.linear_fc1.weight"] = gate_up[e].t().contiguous()
        return out

    monkeypatch.setattr(gpt_oss, "experts_to_megatron", halves)


CONTROLS = {  # each knob ignored or mis-mapped
    "sinks_dropped": lambda mp: _after_loading(mp, ("core_attention.softmax_offset",), -1e4),
    "window_dropped": lambda mp: _arch_changed(mp, sliding_window=None),
    "yarn_ignored": lambda mp: mp.setattr(gpt_oss, "use_yarn", lambda model, arch: None),
    "yarn_attention_factor_ignored": lambda mp: mp.setattr(gpt_oss, "yarn_attention_factor", lambda factor: 1.0),
    "router_bias_zeroed": lambda mp: _after_loading(mp, ("router.bias",), 0.0),
    "expert_biases_zeroed": lambda mp: _after_loading(mp, ("linear_fc1.bias", "linear_fc2.bias"), 0.0),
    "swiglu_alpha_ignored": lambda mp: _arch_changed(mp, swiglu_alpha=1.0),  # x * sigmoid(x) as the gate
    "gate_up_read_in_halves": _gate_up_read_in_halves,
}


@pytest.mark.parametrize("control", CONTROLS)
def test_each_knob_has_a_negative_control(path, monkeypatch, control):
    CONTROLS[control](monkeypatch)
    agreement, _ = agreement_with_transformers(path)
    assert not agreement.ok and agreement.max_abs_diff > 100 * TOL, agreement


def test_the_swiglu_clamp_binds_and_is_computed(path, tmp_path, monkeypatch):
    """A copy whose ``swiglu_limit`` (0.05) the tiny model's activations pass: still equal to transformers; with the
    clamp lifted, not."""
    copy = shutil.copytree(path, tmp_path / "clamped")
    cfg = json.loads((copy / "config.json").read_text())
    (copy / "config.json").write_text(json.dumps(dict(cfg, swiglu_limit=0.05)))
    agreement, logprob_diff = agreement_with_transformers(copy)
    assert agreement.ok and logprob_diff < TOL, (agreement, logprob_diff)
    _arch_changed(monkeypatch, swiglu_limit=1e9)
    agreement, _ = agreement_with_transformers(copy)
    assert not agreement.ok and agreement.max_abs_diff > 100 * TOL, agreement


@pytest.mark.parametrize("change, words", [
    ({"rope_parameters": {"rope_type": "linear", "rope_theta": 1e4, "factor": 2.0}}, "RoPE scaling 'linear'"),
    ({"rope_parameters": {"rope_type": "yarn", "rope_theta": 1e4, "factor": 8.0, "original_max_position_embeddings": 64,
                          "mscale": 1.0, "mscale_all_dim": 1.0}}, "mscale"),
    ({"layer_types": ["sliding_attention"]}, "layer_types"),
    ({"attention_bias": False}, "attention_bias=False"),
])
def test_what_the_mapping_lacks_is_refused_with_the_reason(path, change, words):
    cfg = json.loads((path / "config.json").read_text())
    with pytest.raises(ModelError, match=words.replace("(", r"\(").replace("'", ".")):
        moe.MoEArchitecture.from_hf_config(dict(cfg, **change))


def test_tensor_parallelism_is_refused_with_the_reason(path):
    arch = moe.MoEArchitecture.from_hf_folder(path)
    gpt_oss.check_layout(arch, 1)
    with pytest.raises(ModelError, match="GPT-OSS under tensor parallelism"):
        gpt_oss.check_layout(arch, 2)


def test_the_exported_folder_gives_the_policys_logprobs_after_a_step(path, tmp_path):
    from rlkit.tracking.export import export_hf_folder

    policy = in_process_policy(PolicyConfig(model_name=str(path), train_micro_batch_size=4,
                                            optimizer=OptimizerConfig(lr=1e-2)))
    try:
        policy.train_step(random_batch(b=8, t=80), pg_token_mean_loss)
        policy.model.eval()
        with torch.no_grad():
            stepped = token_logprobs(policy.adapter.logits(IDS), IDS)
        out = export_hf_folder(policy, path, tmp_path / "export", None)
    finally:
        policy.close()
    exported = token_logprobs(transformers_logits(out), IDS)
    assert (exported - stepped).abs().max() < TOL
    assert (exported - token_logprobs(transformers_logits(path), IDS)).abs().max() > 1e-3  # the step moved them


def test_the_transformers_generator_agrees_with_the_policy_after_a_step_and_refit(path):
    """transformers generate (the generator validation picks on the CPU, see test_a_session_...) refit with the stacked
    experts, sinks and biases: it agrees with the policy, not after a policy step, and again after the refit."""
    from rlkit.generation.hf import HFGenerator
    from rlkit.weight_sync import ColocatedWeightSync

    texts, ids = arithmetic_prompts()
    policy = in_process_policy(PolicyConfig(model_name=str(path), optimizer=OptimizerConfig(lr=1e-2)))
    generator = HFGenerator(path, GenerationConfig(backend="hf"), max_model_len=128, seed=0)
    mismatch = lambda seed: generator_policy_mismatch(generator, policy, texts, ids, seed)  # noqa: E731
    try:
        agree_then_step(policy, mismatch)
        ColocatedWeightSync().sync(policy, generator)
        diff, batch = mismatch(3)
        assert batch.attention_mask.sum(1).max() > PRESET_WINDOW  # past the window
        assert diff.max() < 1e-3 and diff.mean() < 1e-4, (diff.max(), diff.mean())
    finally:
        generator.close()
        policy.close()


def test_the_policys_own_generator_samples_what_it_scores_past_the_window(path):
    """policy.generation.backend=megatron: a KV-cached decode (sinks, the window's mask over the cache, YaRN's table at
    each new position) gives the logprobs a full forward gives (1e-5)."""
    lengths = own_generator_matches_a_full_forward(path)
    assert max(lengths) > 2 * PRESET_WINDOW


@pytest.fixture(scope="module")
def eos_heavy(tmp_path_factory):
    """A GPT-OSS folder with the BPE tokenizer's two EOS ids in generation_config.json (<|im_end|> 2, <|endoftext|>
    0), both given one output row, scaled up: a random model samples either often, equally likely."""
    from safetensors.torch import load_file, save_file

    from rlkit.models.factory import make_model

    folder = make_model(tmp_path_factory.mktemp("gpt-oss-eos"), "nano-moe", "gpt-oss", seed=1, tokenizer="bpe")
    assert json.loads((folder / "generation_config.json").read_text())["eos_token_id"] == [2, 0]
    weights = load_file(str(folder / "model.safetensors"))
    head = weights["lm_head.weight"]
    head[[0, 2]] = 6 * head[2]
    save_file(weights, str(folder / "model.safetensors"), metadata={"format": "pt"})
    return folder


@pytest.mark.parametrize("engine", ["hf", "megatron"])
def test_sampling_stops_at_both_eos_ids(eos_heavy, engine):
    sampling = SamplingSettings(max_new_tokens=24, seed=0)
    prompts = [list(range(10 + i, 50 + i)) for i in range(4)]
    if engine == "hf":
        from rlkit.generation.hf import HFGenerator

        generator = HFGenerator(eos_heavy, GenerationConfig(backend="hf"), max_model_len=128, seed=0)
        out = generator.generate(prompts, 8, sampling)
        generator.close()
    else:
        policy = in_process_policy(PolicyConfig(model_name=str(eos_heavy)))
        try:
            out = policy.adapter.own_generator(GenerationConfig(), 128, 0).generate(prompts, 8, sampling)
        finally:
            policy.close()
    ends = set()
    for tokens, reason in zip(out.token_ids, out.finish_reasons):
        assert not {0, 2} & set(tokens[:-1])  # no EOS id inside a completion
        if reason == "stop":
            ends.add(tokens[-1])
    assert ends == {0, 2}  # stopped at each of the two ids


def test_rlkit_train_runs_a_step_on_a_gpt_oss_model_from_the_command_line(tmp_path):
    """quickstart_nano with the nano-moe preset in family gpt-oss and sequences past its window: SFT, one GRPO step, the
    generator's refit, an export that transformers reads back as GPT-OSS with the sinks it trained."""
    out = train_one_step_from_the_cli(tmp_path, "GptOssForCausalLM", **{"policy.model_preset": "nano-moe",
                                                                         "policy.model_family": "gpt-oss",
                                                                         "policy.max_total_sequence_length": 56,
                                                                         "policy.generation.max_new_tokens": 36})
    exported = AutoModelForCausalLM.from_pretrained(str(out), dtype=torch.float32)
    assert exported.model.layers[0].self_attn.sinks.abs().min() > 0


def test_a_session_from_the_preset_falls_back_to_transformers_and_samples_what_the_policy_scores(tmp_path):
    """``policy.model_family=gpt-oss`` with the nano-moe preset and the default engine (vLLM): on this CPU vLLM's GPT-OSS
    is off transformers' by more than a refit generator may be (the family row's measured reason), so validation picks
    transformers generate with one notice; after a step and its refit the sampled tokens' logprobs are the policy's."""
    import warnings

    import rlkit
    from rlkit.config.checks import EngineFallbackWarning
    from rlkit.models.factory import vllm_cpu_refusal

    assert "vLLM's GPT-OSS model on the CPU" in vllm_cpu_refusal({"architectures": ["GptOssForCausalLM"]})
    overrides = {"policy.model_preset": "nano-moe", "policy.model_family": "gpt-oss",
                 "policy.model_name": str(tmp_path / "model"), "logger.log_dir": str(tmp_path / "runs"),
                 "sft.enabled": False, "data.num_train": 64, "data.num_validation": 16, "eval.num_prompts": 16,
                 "grpo.num_prompts_per_step": 4, "grpo.num_generations_per_prompt": 4}
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always", EngineFallbackWarning)
        session = rlkit.Session.from_config("quickstart_nano", overrides)
    notices = [str(w.message) for w in caught if issubclass(w.category, EngineFallbackWarning)]
    with session as s:
        assert s.config.policy.generation.backend == "hf"
        assert len(notices) == 1 and "vLLM's GPT-OSS model on the CPU" in notices[0], notices
        s.step()
        batch = s.logprobs(s.rollout())
        diff = (batch.generator_logprobs - batch.prev_logprobs)[batch.loss_mask].abs()
        assert diff.max() < 1e-3 and diff.mean() < 1e-4 and batch.loss_mask.sum() > 50, (diff.max(), diff.mean())


def test_a_setting_only_vllm_honours_keeps_the_refusal_with_the_families_reason(path):
    """With vllm_cfg.precision=bfloat16 (transformers generate samples in float32) the fallback is not taken: the
    config is refused with the family's measured reason and the setting that blocks the switch."""
    from rlkit.config.loading import load_config
    from rlkit.errors import ConfigError

    with pytest.raises(ConfigError) as info:
        load_config("quickstart", {"policy.model_preset": None, "policy.model_name": str(path),
                                   "policy.generation.vllm_cfg.precision": "bfloat16"})
    assert "vLLM's GPT-OSS model on the CPU" in str(info.value) and "vllm_cfg.precision=bfloat16" in str(info.value)
