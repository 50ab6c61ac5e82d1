"""The model families added for real checkpoints: Llama 3.x (llama3 RoPE scaling), Qwen3 (q/k norms), Qwen3-MoE
and Qwen2-MoE (Qwen expert names, unrenormalised top-k, the gated shared expert), Mistral (Llama's layout; its
preset's 32-position ``sliding_window`` in every layer, which the 400-position logits and the vLLM check run past:
tests/policy/test_families_windows.py), Phi-3 (fused ``qkv_proj`` and ``gate_up_proj`` in the checkpoint;
the preset has Phi-4-mini's partial RoPE and Phi-3-mini-4k's kind of window), SmolLM3 (no RoPE in every 4th layer; every 2nd in the 2-layer preset), OLMo 2 (norms after attention and the MLP,
q/k norms over the whole projection).

Per family, against independent references (fp32): HF -> Megatron logits vs transformers' own model (max abs
within 1e-5 of the logits' scale, :func:`rlkit.models.compare.logits_agreement`; on these tiny models that is
also within the absolute 1e-4 the check used before, so it is no looser), export round trip exact, vLLM's
sampled-token logprobs vs the policy after a train step + refit (max 1e-3, mean 1e-4), and one parallel
layout (TP=2 dense, EP=2 MoE) equal to one process (1e-5). Gemma 3 (text): (1+w) norms before and after attention and
the MLP, embeddings x sqrt(hidden), GELU-tanh, query_pre_attn_scalar, local layers with their own RoPE base and a
32-position window that the 400-position logits check and the vLLM check's sequences run past. Each new knob
has a negative control: the same logits check with the knob ignored or mis-mapped fails, by > 100x 1e-4.
"""

import dataclasses

import pytest
import torch
from transformers import AutoModelForCausalLM

from rlkit.config.backends import MegatronConfig
from rlkit.config.components import OptimizerConfig, PolicyConfig
from rlkit.errors import ModelError
from rlkit.models.compare import LogitsAgreement, logits_agreement
from rlkit.policy import architecture
from rlkit.policy.architecture import load_hf_state
from rlkit.policy.backends import in_process_policy
from rlkit.policy.megatron import moe
from tests.helpers import agree_then_step, engine_beside_a_policy, pg_token_mean_loss, random_batch

TOL = 1e-4  # the old absolute bound: the relative one must be at most this here, and the controls miss by 100x it
FAMILIES = [("llama3", "nano"), ("qwen3", "nano"), ("qwen3-moe", "nano-moe"), ("qwen2-moe", "nano-moe"),
            ("mistral", "nano"), ("phi3", "nano"), ("smollm3", "nano"), ("olmo2", "nano"), ("gemma3", "nano")]


@pytest.fixture(scope="module")
def folder(model_factory):
    return lambda family, preset, **overrides: model_factory(preset, family, seed=1, **overrides)


def logits_error(path, policy=None) -> LogitsAgreement:
    """The Megatron policy's logits against transformers' on the same folder (max abs difference, the bound
    relative to the logits' scale), over 400 positions: far enough that Llama 3's scaling of the slow RoPE
    frequencies shows (at 48 positions, ignoring it moves the logits by only 5e-5)."""
    ids = torch.randint(3, 100, (2, 400), generator=torch.Generator().manual_seed(0))
    hf = AutoModelForCausalLM.from_pretrained(str(path), dtype=torch.float32).eval()
    own = policy is None
    policy = policy or in_process_policy(PolicyConfig(model_name=str(path)))
    try:
        policy.model.eval()
        with torch.no_grad():
            return logits_agreement(policy.adapter.logits(ids), hf(ids).logits)
    finally:
        if own:
            policy.close()


@pytest.mark.parametrize("family,preset", FAMILIES)
def test_logits_match_transformers_and_export_round_trips(folder, family, preset):
    path = folder(family, preset)
    policy = in_process_policy(PolicyConfig(model_name=str(path)))
    try:
        assert isinstance(policy.adapter, moe.MegatronMoEAdapter) == preset.endswith("moe")
        agreement = logits_error(path, policy)
        assert agreement.ok and agreement.bound <= TOL, agreement
        original, exported = load_hf_state(path), policy.hf_state_dict()
        assert set(exported) == set(original) and all(torch.equal(exported[k], original[k]) for k in original)
    finally:
        policy.close()


def test_the_families_use_their_knobs(folder):
    a = architecture.Architecture.from_hf_folder(folder("llama3", "nano"))
    assert a.rope_scaling_factor == 8.0 and not a.qk_layernorm
    assert architecture.Architecture.from_hf_folder(folder("qwen3", "nano")).qk_layernorm
    q2 = moe.MoEArchitecture.from_hf_folder(folder("qwen2-moe", "nano-moe"))
    assert q2.shared_expert_size > 0 and not q2.norm_topk_prob and q2.qkv_bias
    q3 = moe.MoEArchitecture.from_hf_folder(folder("qwen3-moe", "nano-moe"))
    assert q3.shared_expert_size == 0 and q3.norm_topk_prob and q3.qk_layernorm


def test_phi3_reads_and_writes_its_fused_projections(folder):
    from rlkit.policy.megatron.hf_layouts import UnfusedView, fused_groups

    path = folder("phi3", "nano")
    a = architecture.Architecture.from_hf_folder(path)
    assert a.fused_projections and a.rotary_percent == 0.75
    hf = load_hf_state(path)
    assert "model.layers.0.self_attn.qkv_proj.weight" in hf and "model.layers.0.self_attn.q_proj.weight" not in hf
    view = UnfusedView(hf, a.num_attention_heads, a.num_key_value_heads, a.head_dim)
    q, k, v = (view[f"model.layers.0.self_attn.{x}_proj.weight"] for x in "qkv")
    assert q.shape[0] == a.num_attention_heads * a.head_dim and k.shape == v.shape == (a.num_key_value_heads * a.head_dim,
                                                                                       a.hidden_size)
    assert len(view) == len(list(view)) == len(hf) + 3 * a.num_layers  # q, k, v for qkv; gate, up for gate_up
    back = dict(next(fused_groups(iter([[(n, view[n]) for n in view if ".layers.0." in n]]))))
    assert set(back) == {n for n in hf if ".layers.0." in n}
    assert all(torch.equal(back[n], hf[n]) for n in back)


def sharp_attention_copy(path, tmp_path, scale=6.0):
    """A copy of the model folder with q and k scaled up: a random tiny model attends almost uniformly, which
    hides how positions are encoded; sharper attention makes the RoPE frequencies matter to the logits."""
    import shutil

    from safetensors.torch import save_file

    copy = tmp_path / "sharp"
    shutil.copytree(path, copy)
    weights = dict(load_hf_state(path))
    for name in weights:
        if name.endswith(("q_proj.weight", "k_proj.weight", "qkv_proj.weight")):  # Phi-3's v scales too: no matter
            weights[name] = weights[name] * scale
    save_file(weights, str(copy / "model.safetensors"), metadata={"format": "pt"})
    return copy


def _gemma3_arch_changed(monkeypatch, **changes):
    from rlkit.policy.megatron import policy as megatron_policy

    real_config = megatron_policy.transformer_config
    monkeypatch.setattr(megatron_policy, "transformer_config",
                        lambda arch, *a, **k: real_config(dataclasses.replace(arch, **changes), *a, **k))


def _gemma3_norms_scale_by_w(monkeypatch):
    from rlkit.policy.megatron import gemma

    monkeypatch.setattr(gemma, "_offset_rms_norm",
                        lambda x, w, eps: torch.nn.functional.rms_norm(x, (x.shape[-1],), w, eps))


def _gemma3_local_layers_rotate_as_global(monkeypatch):
    from rlkit.policy.megatron import gemma

    monkeypatch.setattr(gemma.GemmaSelfAttention, "forward", gemma.SelfAttention.forward)


def _gemma3_embeddings_unscaled(monkeypatch):
    from rlkit.policy.megatron import gemma

    monkeypatch.setattr(gemma, "scale_embeddings", lambda model, hidden_size: None)


GEMMA3_CONTROLS = {  # each Gemma 3 knob ignored: the window, the local RoPE base, 1+w, sqrt(H), the softmax scale, GELU
    "gemma3_window_dropped": lambda mp: _gemma3_arch_changed(mp, sliding_window=None),
    "gemma3_local_rope_base_ignored": _gemma3_local_layers_rotate_as_global,
    "gemma3_norms_scale_by_w": _gemma3_norms_scale_by_w,
    "gemma3_embeddings_unscaled": _gemma3_embeddings_unscaled,
    "gemma3_softmax_scale_from_head_dim": lambda mp: _gemma3_arch_changed(mp, softmax_scale=None),
    "gemma3_silu_mlp": lambda mp: _gemma3_arch_changed(mp, activation="silu"),
}


@pytest.mark.parametrize("control", ["rope_scaling_ignored", "qk_norms_swapped", "shared_expert_gate_dropped",
                                     "topk_renormalised", "partial_rope_ignored", "fused_qkv_read_per_group",
                                     "nope_layers_rotated", "olmo2_qk_norm_per_head", "olmo2_post_norms_dropped",
                                     *GEMMA3_CONTROLS])
def test_each_knob_has_a_negative_control(folder, monkeypatch, tmp_path, control):
    if control in GEMMA3_CONTROLS:
        path = folder("gemma3", "nano")
        GEMMA3_CONTROLS[control](monkeypatch)
    elif control == "rope_scaling_ignored":
        path = sharp_attention_copy(folder("llama3", "nano"), tmp_path)
        agreement = logits_error(path)
        assert agreement.ok and agreement.bound <= TOL, agreement
        monkeypatch.setattr(architecture, "_llama3_rope_factor", lambda rope: None)
    elif control == "partial_rope_ignored":  # RoPE over the whole head where Phi-4-mini turns 3/4 of it
        path = sharp_attention_copy(folder("phi3", "nano"), tmp_path)
        agreement = logits_error(path)
        assert agreement.ok and agreement.bound <= TOL, agreement
        from rlkit.policy.megatron import policy as megatron_policy

        real_build = megatron_policy.build_gpt_model
        monkeypatch.setattr(megatron_policy, "build_gpt_model",
                            lambda arch, *a, **k: real_build(dataclasses.replace(arch, rotary_percent=1.0), *a, **k))
    elif control == "nope_layers_rotated":  # SmolLM3's NoPE layer given RoPE like the others
        path = sharp_attention_copy(folder("smollm3", "nano"), tmp_path)
        agreement = logits_error(path)
        assert agreement.ok and agreement.bound <= TOL, agreement
        assert architecture.Architecture.from_hf_folder(path).no_rope_layers == (0, 1)
        from rlkit.policy.megatron import policy as megatron_policy

        real_config = megatron_policy.transformer_config
        monkeypatch.setattr(megatron_policy, "transformer_config",
                            lambda arch, *a, **k: real_config(dataclasses.replace(arch, no_rope_layers=None), *a, **k))
    elif control.startswith("olmo2"):  # Qwen3's per-head q/k norm in OLMo 2's place; its branch norms left out
        from rlkit.policy.megatron import post_norm

        path = folder("olmo2", "nano")
        if control == "olmo2_qk_norm_per_head":
            def per_head(self, x):
                normed = x.float() * torch.rsqrt(x.float().pow(2).mean(-1, keepdim=True) + self.eps)
                return self.weight.view(x.shape[-2], x.shape[-1]) * normed

            monkeypatch.setattr(post_norm.ProjectionRMSNorm, "forward", per_head)
        else:
            monkeypatch.setattr(post_norm.PostNormRowParallelLinear, "forward",
                                lambda self, x: post_norm.RowParallelLinear.forward(self, x))
    elif control == "fused_qkv_read_per_group":  # Phi-3's [Q; K; V] read as if it were Megatron's per-group fuse
        path = folder("phi3", "nano", num_key_value_heads=2)
        from rlkit.policy.megatron import convert

        real = convert.attention_to_megatron

        def per_group(hf, i, arch):
            out = real(hf, i, arch)
            name = f"model.layers.{i}.self_attn.qkv_proj.weight"
            out[f"decoder.layers.{i}.self_attention.linear_qkv.weight"] = hf._hf[name]
            return out

        monkeypatch.setattr(moe.convert, "attention_to_megatron", per_group)
    elif control == "qk_norms_swapped":
        path = folder("qwen3", "nano")

        def swapped_attention(hf, i, arch, _real=moe.convert.attention_to_megatron):
            out = _real(hf, i, arch)
            q, k = (f"decoder.layers.{i}.self_attention.{x}_layernorm.weight" for x in "qk")
            out[q], out[k] = out[k], out[q]
            return out

        monkeypatch.setattr(moe.convert, "attention_to_megatron", swapped_attention)
    else:
        path = folder("qwen2-moe", "nano-moe")
        real_build = moe.build_moe_gpt_model

        def build_wrong(arch, *args, **kwargs):
            if control == "topk_renormalised":  # Mixtral's routing instead of Qwen2-MoE's
                return real_build(dataclasses.replace(arch, norm_topk_prob=True), *args, **kwargs)
            model = real_build(arch, *args, **kwargs)
            for layer in model.decoder.layers:  # the shared expert's output unscaled by its sigmoid gate
                layer.mlp.shared_experts.use_shared_expert_gate = False
            return model

        monkeypatch.setattr(moe, "build_moe_gpt_model", build_wrong)
    agreement = logits_error(path)
    assert not agreement.ok and agreement.max_abs_diff > 100 * TOL, agreement


def test_unsupported_rope_scalings_are_refused_with_the_reason():
    base = dict(architectures=["LlamaForCausalLM"], hidden_size=64, num_hidden_layers=2, num_attention_heads=2,
                intermediate_size=96, vocab_size=128, max_position_embeddings=131072, rms_norm_eps=1e-6)
    with pytest.raises(ModelError, match="'yarn' is not supported"):
        architecture.Architecture.from_hf_config(dict(base, rope_parameters={"rope_type": "yarn", "factor": 4.0}))
    llama3 = {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 2.0, "high_freq_factor": 4.0,
              "original_max_position_embeddings": 8192}
    with pytest.raises(ModelError, match="low_freq_factor"):
        architecture.Architecture.from_hf_config(dict(base, rope_parameters=llama3))
    with pytest.raises(ModelError, match="sliding-window"):
        architecture.Architecture.from_hf_config(dict(base, use_sliding_window=True))
    mistral = dict(base, architectures=["MistralForCausalLM"], max_position_embeddings=512)
    windowed = architecture.Architecture.from_hf_config(dict(mistral, sliding_window=256))  # binds: every layer local
    assert windowed.sliding_window == 256 and windowed.local_layers == (1, 1)
    for window in (None, 512):  # no window, or one that covers the whole context: attention is the full causal one
        arch = architecture.Architecture.from_hf_config(dict(mistral, sliding_window=window))
        assert arch.family == "mistral" and arch.sliding_window is None and arch.local_layers is None
    with pytest.raises(ModelError, match="sliding_window: 0 is not a window"):
        architecture.Architecture.from_hf_config(dict(mistral, sliding_window=0))


# A two-rank Ray group per family takes ~2 min on 2 cores: the default suite keeps Qwen3 (its q/k norms' gradients
# summed over TP are what no other layout test covers); Llama 3 (TP=2 as test_parallel.py's Llama) and the MoE
# families (EP=2 as test_parallel.py's Mixtral) run in the slow target (`make test-slow`).
LAYOUT_FAMILIES = [fp if fp[0] == "qwen3" else pytest.param(*fp, marks=pytest.mark.slow) for fp in FAMILIES]
# DeepSeek-V3 (test_families_deepseek_v3.py: its own checks, no vLLM on the CPU) under EP=2 here too (TP refused for MLA)
LAYOUT_FAMILIES.append(pytest.param("deepseek-v3", "nano-moe", marks=pytest.mark.slow))
# GPT-OSS (test_families_gpt_oss.py: the HF generator on the CPU) under EP=2: its sinks and biases (TP refused)
LAYOUT_FAMILIES.append(pytest.param("gpt-oss", "nano-moe", marks=pytest.mark.slow))
# Adam's first step is lr * g / (|g| + eps): for an element whose gradient is ~eps it amplifies the gradient's rounding
# by up to lr / eps. At eps=1e-8 that moved one element by 1.8e-5 (Mistral's gate_proj) and 4.8e-5 (SmolLM3's
# embedding) more under TP=2 while logprobs and the gradient norm agreed within 1e-5; at 1e-6 a mis-sharded
# gradient still moves weights by ~lr = 1e-3, and rounding no longer does.
LAYOUT_EPS = 1e-6


@pytest.mark.parametrize("family,preset", LAYOUT_FAMILIES)
def test_one_parallel_layout_matches_one_process(folder, ray_cluster, family, preset):
    """TP=2 for the dense families (Qwen3's q/k norm gradients summed over the ranks), EP=2 for the MoE ones."""
    from rlkit.policy.workers import RayPolicyGroup

    dense = {} if preset.endswith("moe") else {"num_key_value_heads": 2}  # TP=2 splits whole KV groups
    cfg = PolicyConfig(model_name=str(folder(family, preset, **dense)), train_micro_batch_size=4,
                       optimizer=OptimizerConfig(lr=1e-3, eps=LAYOUT_EPS))
    batch = random_batch(b=8, t=24)
    solo = in_process_policy(cfg)
    try:
        logprobs = solo.logprobs(batch.input_ids, batch.attention_mask).logprobs
        step = solo.train_step(batch, pg_token_mean_loss)
        after = solo.hf_state_dict()
        before = load_hf_state(cfg.model_name)
    finally:
        solo.close()
    layout = (MegatronConfig(expert_model_parallel_size=2) if preset.endswith("moe")
              else MegatronConfig(tensor_model_parallel_size=2))
    group = RayPolicyGroup(cfg.model_copy(update={"megatron_cfg": layout}), world_size=2)
    try:
        assert (group.logprobs(batch.input_ids, batch.attention_mask).logprobs - logprobs).abs().max() < 1e-5
        got = group.train_step(batch, pg_token_mean_loss)
        assert abs(got.grad_norm - step.grad_norm) < 1e-5 * step.grad_norm
        weights = group.hf_state_dict()
        assert set(weights) == set(after)  # (DeepSeek-V3's router bias buffers included)
        assert max((weights[k] - after[k]).abs().max().item() for k in after) < 1e-5
        assert max((after[k] - before[k]).abs().max().item() for k in after) > 5e-4  # moved by ~lr, 50x the bound
        if family.startswith("qwen3") or family in ("olmo2", "gemma3"):  # the q/k norms moved too, equally in both
            norm = "model.layers.0.self_attn.q_norm.weight"
            assert (after[norm] - before[norm]).abs().max() > 1e-5
    finally:
        group.close()


def test_adapters_on_part_of_a_fused_checkpoint_module_are_refused_with_the_reason(folder):
    from rlkit.config.components import LoraConfig

    with pytest.raises(ModelError, match="holds k_proj, q_proj, v_proj as one module, qkv_proj"):
        in_process_policy(PolicyConfig(model_name=str(folder("phi3", "nano")),
                                       lora_cfg=LoraConfig(enabled=True, target_modules=("q_proj", "o_proj"))))


@pytest.mark.parametrize("family", ["olmo2", "gemma3", "phi3"])
def test_adapters_on_the_new_blocks_match_peft(folder, family, tmp_path):
    """OLMo 2's and Gemma 3's branches end in a norm, so an adapter on ``o_proj`` / ``down_proj`` must add its
    update before it; Phi-3's checkpoint fuses q/k/v and gate/up, so peft puts one adapter on each fused module
    (``qkv_proj``, ``gate_up_proj``, their ``B`` rows in the checkpoint's order). After two steps, the PEFT folder
    loaded by peft on transformers' own model, and the merged folder, give the policy's logits (1e-4); the
    adapters moved them (> 1e-3 from the base)."""
    import peft

    from rlkit.config.components import LoraConfig
    from rlkit.tracking.export import ADAPTER_DIR, export_hf_folder

    path = folder(family, "nano")
    cfg = PolicyConfig(model_name=str(path), train_micro_batch_size=4, optimizer=OptimizerConfig(lr=1e-2),
                       lora_cfg=LoraConfig(enabled=True, dim=4, alpha=8))
    policy = in_process_policy(cfg)
    try:
        batch = random_batch(b=8, t=20)
        for _ in range(2):
            policy.train_step(batch, pg_token_mean_loss)
        with torch.no_grad():
            logits = policy.adapter.logits(batch.input_ids)
        out = export_hf_folder(policy, path, tmp_path / "export", cfg.lora_cfg)
        with torch.no_grad():
            base = AutoModelForCausalLM.from_pretrained(str(path), dtype=torch.float32).eval()
            assert (base(input_ids=batch.input_ids).logits - logits).abs().max() > 1e-3
            adapted = peft.PeftModel.from_pretrained(base, str(out / ADAPTER_DIR)).eval()
            assert (adapted(input_ids=batch.input_ids).logits - logits).abs().max() < TOL
            if family == "phi3":
                assert {"qkv_proj", "gate_up_proj"} <= set(adapted.peft_config["default"].target_modules)
            merged = AutoModelForCausalLM.from_pretrained(str(out), dtype=torch.float32).eval()
            assert (merged(input_ids=batch.input_ids).logits - logits).abs().max() < TOL
    finally:
        policy.close()


# Last in this file: vLLM runs SmolLM3 and OLMo 2 through its Transformers backend, which rewraps transformers' own
# model class of the architecture for the whole process when it loads one, so transformers cannot build that model in
# this process afterwards (the tests above make folders and build transformers' models).
@pytest.mark.parametrize("family,preset,tied", [(f, p, False) for f, p in FAMILIES] + [("qwen3", "nano", True)])
def test_vllm_agrees_with_the_policy_after_a_step_and_refit(folder, family, preset, tied):
    from rlkit.weight_sync import ColocatedWeightSync

    path = folder(family, preset, **({"tie_word_embeddings": True} if tied else {}))
    policy, generator, mismatch = engine_beside_a_policy(path)
    try:
        agree_then_step(policy, mismatch)
        ColocatedWeightSync().sync(policy, generator)
        diff, _ = mismatch(3)
        assert diff.max() < 1e-3 and diff.mean() < 1e-4
    finally:
        generator.close()
        policy.close()
