"""DeepSeek-V3 through the Megatron policy: multi-head latent attention (Megatron-Core's ``MLASelfAttention`` on the
CPU, rlkit.policy.megatron.mla), the first layer dense, then routed experts with a shared expert, sigmoid scores with
the score-correction bias, group-limited top-k, the kept scores renormalised and scaled (rlkit.policy.megatron.moe).

Against independent references (fp32): the policy's logits and token logprobs vs transformers' own eager model over
400 positions (bound 1e-4), the export exact, and the transformers generator (the fallback validation chooses: vLLM's
MLA kernels lack the preset's size) after a train step + refit within 1e-3 of the policy. Each routing knob has a
negative control that misses by > 100x the bound (so has MLA's interleaved RoPE order), and what the mapping lacks is
refused with the reason. Slow suite: EP=2 against one process within 1e-5 (test_families.py's layout test).
"""

import dataclasses
import json
import shutil

import pytest
import torch
from transformers import AutoModelForCausalLM

from rlkit.config.components import GenerationConfig, OptimizerConfig, PolicyConfig
from rlkit.errors import ModelError
from rlkit.models.compare import logits_agreement
from rlkit.policy.architecture import load_hf_state
from rlkit.policy.backends import in_process_policy
from rlkit.policy.megatron import moe
from tests.helpers import (agree_then_step, arithmetic_prompts, generator_policy_mismatch,
                           train_one_step_from_the_cli)

TOL = 1e-4


@pytest.fixture(scope="module")
def path(model_factory):
    return model_factory("nano-moe", "deepseek-v3", seed=1)


def agreement_with_transformers(path, policy=None):
    """The policy's logits against transformers' fp32 eager forward, and the largest token-logprob difference."""
    ids = torch.randint(3, 100, (2, 400), generator=torch.Generator().manual_seed(0))
    hf = AutoModelForCausalLM.from_pretrained(str(path), dtype=torch.float32, attn_implementation="eager").eval()
    own = policy is None
    policy = policy or in_process_policy(PolicyConfig(model_name=str(path)))
    try:
        policy.model.eval()
        with torch.no_grad():
            ours, theirs = policy.adapter.logits(ids), hf(ids).logits
        token_lp = [torch.log_softmax(x, -1)[:, :-1].gather(-1, ids[:, 1:, None]) for x in (ours, theirs)]
        return logits_agreement(ours, theirs), (token_lp[0] - token_lp[1]).abs().max().item()
    finally:
        if own:
            policy.close()


def test_logits_match_transformers_and_export_round_trips(path):
    policy = in_process_policy(PolicyConfig(model_name=str(path)))
    try:
        arch = policy.adapter.arch
        assert isinstance(policy.adapter, moe.MegatronMoEAdapter) and arch.kv_lora_rank and arch.first_dense_layers == 1
        layers = policy.model.decoder.layers
        assert not hasattr(layers[0].mlp, "router") and hasattr(layers[1].mlp, "router")  # dense, then MoE
        assert layers[1].mlp.router.expert_bias.abs().min() > 0  # the checkpoint's (jittered) bias, loaded
        agreement, logprob_diff = agreement_with_transformers(path, policy)
        assert agreement.ok and agreement.bound <= TOL and logprob_diff < TOL, (agreement, logprob_diff)
        original, exported = load_hf_state(path), policy.hf_state_dict()
        assert set(exported) == set(original) and all(torch.equal(exported[k], original[k]) for k in original)
    finally:
        policy.close()


def _arch_changed(monkeypatch, **changes):
    real = moe.build_moe_gpt_model
    monkeypatch.setattr(moe, "build_moe_gpt_model",
                        lambda arch, *a, **k: real(dataclasses.replace(arch, **changes), *a, **k))


def _bias_zeroed(monkeypatch):
    real = moe.MegatronMoEAdapter.copy_hf_state

    def load_then_zero(self, hf):
        real(self, hf)
        for name, buffer in self.model.named_buffers():
            if name.endswith("router.expert_bias"):
                buffer.zero_()

    monkeypatch.setattr(moe.MegatronMoEAdapter, "copy_hf_state", load_then_zero)


def _rope_dims_read_in_halves(monkeypatch):
    """The RoPE parts of the query and the shared key permuted from DeepSeek's interleaved order to halves, so the
    rotation pairs other dims: what a mapping that ignored rope_interleave would compute."""
    from rlkit.policy.megatron import mla

    real = mla.attention_to_megatron

    def halves(hf, i, arch):
        out = real(hf, i, arch)
        n, dn, dr, kr = arch.num_attention_heads, arch.qk_nope_head_dim, arch.qk_rope_head_dim, arch.kv_lora_rank
        order = torch.cat([torch.arange(0, dr, 2), torch.arange(1, dr, 2)])
        q_name, kv_name = (f"decoder.layers.{i}.self_attention.{x}.weight" for x in ("linear_q_up_proj",
                                                                                     "linear_kv_down_proj"))
        q = out[q_name].reshape(n, dn + dr, -1).clone()
        q[:, dn:] = q[:, dn:][:, order]
        kv = out[kv_name].clone()
        kv[kr:] = kv[kr:][order]
        out[q_name], out[kv_name] = q.reshape(n * (dn + dr), -1), kv
        return out

    monkeypatch.setattr(mla, "attention_to_megatron", halves)


CONTROLS = {  # each routing knob ignored, and MLA's RoPE dims read in the wrong order
    "softmax_scores": lambda mp: _arch_changed(mp, score_function="softmax", expert_bias=False),
    "groups_ignored": lambda mp: _arch_changed(mp, num_groups=None, group_topk=None),
    "scaling_ignored": lambda mp: _arch_changed(mp, routed_scaling_factor=1.0),
    "shared_expert_dropped": lambda mp: _arch_changed(mp, shared_expert_size=0),
    "score_correction_bias_zeroed": _bias_zeroed,
    "rope_dims_read_in_halves": _rope_dims_read_in_halves,
}


@pytest.mark.parametrize("control", CONTROLS)
def test_each_knob_has_a_negative_control(path, monkeypatch, control):
    CONTROLS[control](monkeypatch)
    agreement, _ = agreement_with_transformers(path)
    assert not agreement.ok and agreement.max_abs_diff > 100 * TOL, agreement


@pytest.mark.parametrize("change, words", [
    ({"rope_parameters": {"rope_type": "yarn", "rope_theta": 10000.0, "factor": 40.0,
                          "original_max_position_embeddings": 4096}}, "RoPE scaling 'yarn'"),
    ({"rope_interleave": False}, "rope_interleave: false"),
    ({"norm_topk_prob": False}, "norm_topk_prob: false"),
    ({"num_experts_per_tok": 3}, "num_experts_per_tok=3, topk_group=1"),
    ({"first_k_dense_replace": 2}, "has no MoE layer"),
])
def test_what_the_mapping_lacks_is_refused_with_the_reason(path, tmp_path, change, words):
    copy = shutil.copytree(path, tmp_path / "m")
    cfg = json.loads((copy / "config.json").read_text())
    (copy / "config.json").write_text(json.dumps(dict(cfg, **change)))
    with pytest.raises(ModelError, match=words.replace("(", r"\(").replace("'", ".")):
        moe.MoEArchitecture.from_hf_config(json.loads((copy / "config.json").read_text()))


def test_the_transformers_generator_agrees_with_the_policy_after_a_step_and_refit(path):
    from rlkit.generation.hf import HFGenerator
    from rlkit.weight_sync import ColocatedWeightSync

    texts, ids = arithmetic_prompts()
    policy = in_process_policy(PolicyConfig(model_name=str(path), optimizer=OptimizerConfig(lr=1e-2)))
    generator = HFGenerator(path, GenerationConfig(backend="hf"), max_model_len=128, seed=0)
    mismatch = lambda seed: generator_policy_mismatch(generator, policy, texts, ids, seed)  # noqa: E731
    try:
        agree_then_step(policy, mismatch)
        ColocatedWeightSync().sync(policy, generator)
        diff, _ = mismatch(3)
        assert diff.max() < 1e-3 and diff.mean() < 1e-4, (diff.max(), diff.mean())
    finally:
        generator.close()
        policy.close()


@pytest.mark.parametrize("backend", [None, "megatron"])
def test_a_session_from_the_preset_samples_what_the_policy_scores_after_a_step(tmp_path, backend):
    """``policy.model_family=deepseek-v3`` with the nano-moe preset: vLLM's MLA kernels lack its size (kv_lora_rank +
    qk_rope_head_dim = 48; they take 320, 512, 576), so validation picks transformers generate with its notice; the
    Megatron generator samples from the policy's own MLA model. Either way the sampled tokens' logprobs are the policy's after a step and its refit."""
    import warnings

    import rlkit
    from rlkit.config.checks import EngineFallbackWarning

    overrides = {"policy.model_preset": "nano-moe", "policy.model_family": "deepseek-v3",
                 "policy.model_name": str(tmp_path / "model"), "logger.log_dir": str(tmp_path / "runs"),
                 "sft.enabled": False, "data.num_train": 64, "data.num_validation": 16, "eval.num_prompts": 16,
                 "grpo.num_prompts_per_step": 4, "grpo.num_generations_per_prompt": 4}
    if backend:
        overrides["policy.generation.backend"] = backend
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always", EngineFallbackWarning)
        session = rlkit.Session.from_config("quickstart_nano", overrides)
    notices = [str(w.message) for w in caught if issubclass(w.category, EngineFallbackWarning)]
    with session as s:
        assert s.config.policy.generation.backend == (backend or "hf")
        assert len(notices) == (0 if backend else 1)
        assert all("no head size kv_lora_rank + qk_rope_head_dim = 48 " in n for n in notices), notices
        s.step()
        batch = s.logprobs(s.rollout())
        diff = (batch.generator_logprobs - batch.prev_logprobs)[batch.loss_mask].abs()
        assert diff.max() < 1e-3 and diff.mean() < 1e-4 and batch.loss_mask.sum() > 50, (diff.max(), diff.mean())


def test_rlkit_train_runs_a_step_on_a_deepseek_v3_model_from_the_command_line(tmp_path):
    """quickstart_nano with the nano-moe preset in family deepseek-v3: SFT, one GRPO step (generating with transformers,
    the fallback), refit, export that transformers reads back as DeepSeek-V3."""
    out = train_one_step_from_the_cli(tmp_path, "DeepseekV3ForCausalLM", **{"policy.model_preset": "nano-moe",
                                                                             "policy.model_family": "deepseek-v3"})
    exported = AutoModelForCausalLM.from_pretrained(str(out), dtype=torch.float32)
    assert exported.model.layers[1].mlp.gate.e_score_correction_bias.abs().min() > 0  # the bias travelled
