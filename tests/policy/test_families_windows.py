"""Mistral's and Phi-3's sliding window through the Megatron policy (issue 52): transformers applies their
``sliding_window`` in every layer whenever it is set, and the presets set 32 positions, so every check here runs on
sequences past it. The window is Gemma 3's machinery (:mod:`rlkit.policy.megatron.sliding_window`), every layer local.

Against independent references (fp32): the policy's token logprobs vs transformers' own eager forward (1e-4), with the
window dropped as the negative control; vLLM on the CPU (its per-model window in its CPU attention) after a step and a
refit (1e-3); the policy's own KV-cached generator; the exported folder read back by transformers after a step (1e-4);
one ``rlkit train`` step from the command line. TP=2 and the export round trip run in tests/policy/test_families.py,
whose presets are the same windowed ones.
"""

import dataclasses

import pytest
import torch
from transformers import AutoModelForCausalLM

from rlkit.config.components import GenerationConfig, OptimizerConfig, PolicyConfig
from rlkit.generation.base import SamplingSettings
from rlkit.models.factory import PRESET_WINDOW
from rlkit.policy.architecture import Architecture
from rlkit.policy.backends import in_process_policy
from tests.helpers import own_generator_matches_a_full_forward, pg_token_mean_loss, random_batch, train_one_step_from_the_cli

WINDOWED = ["mistral", "phi3"]
TOL = 1e-4


@pytest.fixture(scope="module")
def folder(model_factory):
    return lambda family: model_factory("nano", family, seed=1)


def token_logprobs(logits: torch.Tensor, ids: torch.Tensor) -> torch.Tensor:
    """Logprobs [b, s-1] of each next token under ``logits`` [b, s, v]."""
    return torch.log_softmax(logits[:, :-1].float(), -1).gather(-1, ids[:, 1:, None])[..., 0]


def transformers_logprobs(path, ids: torch.Tensor) -> torch.Tensor:
    model = AutoModelForCausalLM.from_pretrained(str(path), dtype=torch.float32, attn_implementation="eager").eval()
    with torch.no_grad():
        return token_logprobs(model(ids).logits, ids)


def policy_logprobs(path, ids: torch.Tensor) -> torch.Tensor:
    policy = in_process_policy(PolicyConfig(model_name=str(path)))
    try:
        policy.model.eval()
        with torch.no_grad():
            return token_logprobs(policy.adapter.logits(ids), ids)
    finally:
        policy.close()


IDS = torch.randint(3, 100, (2, 400), generator=torch.Generator().manual_seed(0))  # 12x the window


@pytest.mark.parametrize("family", WINDOWED)
def test_logprobs_past_the_window_match_transformers_eager(folder, family, monkeypatch):
    """Every layer local: equal to transformers' eager forward (1e-4; measured 9.5e-7); with the window dropped
    (Megatron attending to the whole sequence) the same check misses by > 1e-2 (measured 0.18)."""
    path = folder(family)
    arch = Architecture.from_hf_folder(path)
    assert arch.sliding_window == PRESET_WINDOW and arch.local_layers == (1,) * arch.num_layers
    reference = transformers_logprobs(path, IDS)
    assert (policy_logprobs(path, IDS) - reference).abs().max() < TOL

    from rlkit.policy.megatron import policy as megatron_policy

    real = megatron_policy.transformer_config
    monkeypatch.setattr(megatron_policy, "transformer_config",
                        lambda a, *args, **kw: real(dataclasses.replace(a, sliding_window=None), *args, **kw))
    assert (policy_logprobs(path, IDS) - reference).abs().max() > 1e-2


@pytest.mark.parametrize("family", WINDOWED)
def test_vllm_agrees_with_the_policy_past_the_window_after_a_step_and_refit(folder, family):
    """vLLM on the CPU (Llama's model class with the config's window in its CPU attention) on rows twice the window
    long: it agrees with the policy, not after a policy step, and again after the refit (max 1e-3, mean 1e-4)."""
    from rlkit.weight_sync import ColocatedWeightSync
    from tests.helpers import agree_then_step, engine_beside_a_policy, generator_policy_mismatch

    policy, generator, _ = engine_beside_a_policy(folder(family))
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


def test_the_policys_own_generator_samples_what_it_scores_past_the_window(folder):
    """policy.generation.backend=megatron on Mistral: a KV-cached decode (the window's mask for one query over the
    cache) gives the logprobs a full forward gives (1e-5)."""
    lengths = own_generator_matches_a_full_forward(folder("mistral"))
    assert min(lengths) > PRESET_WINDOW and max(lengths) > 2 * PRESET_WINDOW  # decoded past the window


@pytest.mark.parametrize("family", WINDOWED)
def test_the_exported_folder_gives_the_policys_logprobs_after_a_step(folder, family, tmp_path):
    """After a train step the exported folder, read by transformers (eager, its window from the copied config), gives
    the policy's logprobs past the window (1e-4); the step moved them (> 1e-3)."""
    from rlkit.tracking.export import export_hf_folder

    path = folder(family)
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
    assert Architecture.from_hf_folder(out).sliding_window == PRESET_WINDOW
    exported = transformers_logprobs(out, IDS)
    assert (exported - stepped).abs().max() < TOL
    assert (exported - transformers_logprobs(path, IDS)).abs().max() > 1e-3


def test_rlkit_train_runs_a_step_on_a_windowed_mistral_from_the_command_line(tmp_path):
    """quickstart_nano with policy.model_family=mistral (the preset's 32-position window) and sequences longer than
    it: SFT, one GRPO step, vLLM refit, export."""
    train_one_step_from_the_cli(tmp_path, "MistralForCausalLM", **{"policy.model_family": "mistral",
                                                                    "policy.max_total_sequence_length": 56,
                                                                    "policy.generation.max_new_tokens": 36})
