"""Low-rank adapters (``policy.lora_cfg``) on every backend, against independent references: peft's own forward
(the transformers and DTensor backends, and the Megatron adapters exported as a PEFT folder), transformers on
the merged weights, vLLM after a refit, and the single-process policy for TP=2 (test_parallel.py's harness)."""

import pytest
import torch

from rlkit.config.components import OptimizerConfig, PolicyConfig
from rlkit.policy.backends import in_process_policy
from tests.helpers import arithmetic_prompts, generator_policy_mismatch, pg_token_mean_loss, random_batch

HF = {"hf_cfg": {"enabled": True}, "megatron_cfg": {"enabled": False}}
DTENSOR = {"dtensor_cfg": {"enabled": True}, "megatron_cfg": {"enabled": False}}
BACKENDS = {"megatron": {}, "hf": HF, "dtensor": DTENSOR}


@pytest.fixture(scope="module")
def nano(model_factory):
    return model_factory("nano", "qwen2", seed=1, num_key_value_heads=2)  # QKV bias: a fused layout with a bias


def lora_cfg(path, backend="megatron", precision="float32", **lora):
    return PolicyConfig(model_name=str(path), train_micro_batch_size=4, optimizer=OptimizerConfig(lr=1e-2),
                        precision=precision, lora_cfg={"enabled": True, "dim": 4, "alpha": 8, **lora},
                        **BACKENDS[backend])


def trained(policy, steps=2):
    """``policy`` after ``steps`` optimizer steps on a random batch (so every ``lora_B`` is non-zero)."""
    batch = random_batch(b=8, t=20)
    for _ in range(steps):
        policy.train_step(batch, pg_token_mean_loss)
    return policy


def token_logprobs(logits, batch):
    lp = torch.log_softmax(logits[:, :-1].float(), -1).gather(-1, batch.input_ids[:, 1:, None]).squeeze(-1)
    return torch.nn.functional.pad(lp, (1, 0)) * batch.attention_mask


@pytest.mark.parametrize("backend", ["megatron", "hf", "dtensor"])
def test_only_adapters_train_and_the_reference_is_the_base(nano, backend):
    policy = in_process_policy(lora_cfg(nano, backend))
    try:
        params = dict(policy.model.named_parameters())
        adapters = {n for n in params if ".lora_" in n}
        in_optimizer = {id(p) for group in policy.optimizer.param_groups for p in group["params"]}
        assert adapters and in_optimizer == {id(params[n]) for n in adapters}  # the optimizer holds adapters only
        assert all(params[n].requires_grad == (n in adapters) for n in params)
        batch = random_batch(b=8, t=20)
        base = policy.logprobs(batch.input_ids, batch.attention_mask).logprobs
        before = {n: p.detach().clone() for n, p in params.items()}
        trained(policy)
        moved = {n: (p.detach() - before[n]).abs().max().item() for n, p in params.items()}
        assert all(moved[n] == 0.0 for n in params if n not in adapters)  # the base never changes
        assert min(moved[n] for n in adapters if ".lora_B" in n) > 0
        live = policy.logprobs(batch.input_ids, batch.attention_mask).logprobs
        assert (live - base).abs().max() > 1e-3
        # the reference is the base with the adapters off: no copy held, equal to the untrained model
        assert policy.reference_state is None
        ref = policy.reference_logprobs(batch.input_ids, batch.attention_mask).logprobs
        assert (ref - base).abs().max() == 0.0
        assert (policy.logprobs(batch.input_ids, batch.attention_mask).logprobs - live).abs().max() == 0.0
    finally:
        policy.close()


@pytest.mark.parametrize("backend", ["hf", "dtensor"])
def test_transformers_backends_match_peft_forward(nano, backend):
    """The policy's logprobs equal a PeftModel's built by peft from the same base and adapter weights."""
    import peft
    from transformers import AutoModelForCausalLM

    from rlkit.policy.lora import peft_lora_config

    cfg = lora_cfg(nano, backend, dropout=0.0)
    policy = trained(in_process_policy(cfg))
    try:
        batch = random_batch(b=8, t=20)
        ours = policy.logprobs(batch.input_ids, batch.attention_mask).logprobs
        reference = peft.get_peft_model(AutoModelForCausalLM.from_pretrained(str(nano), dtype=torch.float32),
                                        peft_lora_config(cfg.lora_cfg))
        adapters = dict(policy.export_adapter_tensors())  # PEFT file names
        assert not peft.set_peft_model_state_dict(reference, adapters).unexpected_keys
        loaded = dict(reference.named_parameters())
        assert all(torch.equal(loaded[n.replace(".weight", ".default.weight")], t) for n, t in adapters.items())
        reference.eval()
        with torch.no_grad():
            theirs = token_logprobs(reference(input_ids=batch.input_ids).logits, batch)
        assert (ours - theirs).abs().max() < 1e-5
        assert (ours - token_logprobs(AutoModelForCausalLM.from_pretrained(str(nano)).eval()(
            input_ids=batch.input_ids).logits.detach(), batch)).abs().max() > 1e-3  # the adapters matter
    finally:
        policy.close()


# Megatron's layouts: one adapter per HF projection (the default, as peft's), a subset of a fused linear's
# projections, and one adapter over each fused linear (a shared A: policy.lora_cfg.fused_adapters)
LAYOUTS = {"per-projection": {}, "subset": {"target_modules": ["q_proj", "v_proj", "up_proj", "o_proj"]},
           "fused": {"fused_adapters": True}}


@pytest.mark.parametrize("backend, layout", [("megatron", "per-projection"), ("megatron", "subset"),
                                             ("megatron", "fused"), ("hf", "per-projection")])
def test_export_writes_merged_and_peft_adapter_folders(nano, backend, layout, tmp_path):
    """The merged HF folder (the refit's merge) and ``adapter/`` loaded with ``PeftModel.from_pretrained`` give
    the policy's logits, for each of Megatron's adapter layouts."""
    import peft
    from transformers import AutoModelForCausalLM

    from rlkit.tracking.export import ADAPTER_DIR, export_hf_folder

    cfg = lora_cfg(nano, backend, **LAYOUTS[layout])
    policy = trained(in_process_policy(cfg))
    try:
        batch = random_batch(b=8, t=20)
        with torch.no_grad():
            logits = policy.adapter.logits(batch.input_ids)  # [b, T, V] at TP=1 (temperature 1)
        out = export_hf_folder(policy, nano, tmp_path / "export", cfg.lora_cfg)
        adapter_bytes = sum(f.stat().st_size for f in (out / ADAPTER_DIR).iterdir())
        model_bytes = sum(f.stat().st_size for f in out.glob("*.safetensors"))
        assert adapter_bytes < model_bytes / 2  # the adapters are small
        with torch.no_grad():
            merged = AutoModelForCausalLM.from_pretrained(str(out), dtype=torch.float32).eval()
            assert (merged(input_ids=batch.input_ids).logits - logits).abs().max() < 1e-4
            base = AutoModelForCausalLM.from_pretrained(str(nano), dtype=torch.float32)
            adapted = peft.PeftModel.from_pretrained(base, str(out / ADAPTER_DIR)).eval()
            assert (adapted(input_ids=batch.input_ids).logits - logits).abs().max() < 1e-4
            adapted_names = {n.split(".lora_")[0].rsplit(".", 1)[-1] for n, _ in adapted.named_parameters()
                             if ".lora_B" in n}
            assert adapted_names == set(cfg.lora_cfg.hf_targets())
        shared = {n: p for n, p in policy.model.named_parameters() if ".lora_A" in n}
        # a fused adapter's A is one tensor for q, k and v; per projection each has its own
        assert any("linear_qkv.adapter.lora_A" == n.split("layers.0.self_attention.")[-1] for n in shared) == \
            (backend == "megatron" and layout == "fused")
    finally:
        policy.close()


@pytest.mark.parametrize("backend", ["megatron", "hf"])
def test_checkpoint_holds_the_adapters_and_resumes_exactly(nano, backend, tmp_path):
    from torch.distributed.checkpoint import HuggingFaceStorageReader

    cfg = lora_cfg(nano, backend)
    batch = random_batch(b=8, t=20, seed=3)
    first = trained(in_process_policy(cfg), steps=1)
    try:
        first.save_state(tmp_path / "ckpt")
        first.train_step(batch, pg_token_mean_loss)
        expected = first.logprobs(batch.input_ids, batch.attention_mask).logprobs
    finally:
        first.close()
    keys = HuggingFaceStorageReader(str(tmp_path / "ckpt" / "shards")).read_metadata().state_dict_metadata
    assert keys and all(".lora_" in k for k in keys)  # adapters (and their optimizer state) only
    second = in_process_policy(cfg)
    try:
        second.load_state(tmp_path / "ckpt")
        assert second.version == 1
        second.train_step(batch, pg_token_mean_loss)
        assert torch.equal(second.logprobs(batch.input_ids, batch.attention_mask).logprobs, expected)
    finally:
        second.close()


def test_vllm_agrees_with_the_adapted_policy_after_a_refit(model_factory):
    """After a LoRA step, the merged-weights refit leaves vLLM's logprobs within 1e-3 of the policy's."""
    from rlkit.config.components import GenerationConfig
    from rlkit.generation.vllm import VllmGenerator
    from rlkit.weight_sync import ColocatedWeightSync

    path = model_factory("nano", "llama")
    texts, ids = arithmetic_prompts()
    policy = in_process_policy(lora_cfg(path))
    generator = VllmGenerator(path, GenerationConfig(), max_model_len=128, seed=0)
    try:
        diff, batch = generator_policy_mismatch(generator, policy, texts, ids, 1)
        assert diff.max() < 1e-3
        adv = torch.randn(batch.batch_size, 1, generator=torch.Generator().manual_seed(0)) * batch.loss_mask
        policy.train_step(batch.with_(advantages=adv), pg_token_mean_loss)
        stale, _ = generator_policy_mismatch(generator, policy, texts, ids, 2)
        assert stale.max() > 1e-2  # the step moved the policy away from the engine's weights
        ColocatedWeightSync().sync(policy, generator)
        diff, batch = generator_policy_mismatch(generator, policy, texts, ids, 3)
        assert diff.max() < 1e-3 and batch.loss_mask.sum() > 100
    finally:
        generator.close()
        policy.close()


def test_lora_config_is_checked_at_load(tmp_path):
    from rlkit.config.loading import load_config
    from rlkit.errors import ConfigError

    with pytest.raises(ConfigError) as err:
        load_config("quickstart_nano", [f"policy.model_name={tmp_path}/m", "policy.lora_cfg.enabled=true",
                                        "policy.lora_cfg.use_dora=true", "policy.lora_cfg.target_modules=[q_proj,v_prj]"])
    text = str(err.value)
    assert "policy.lora_cfg.use_dora" in text and "did you mean 'v_proj'" in text
    partial = [f"policy.model_name={tmp_path}/m", "policy.lora_cfg.enabled=true",
               "policy.lora_cfg.target_modules=[q_proj,v_proj]"]
    assert load_config("quickstart_nano", partial).policy.lora_cfg.hf_targets() == ("q_proj", "v_proj")
    with pytest.raises(ConfigError, match="with fused_adapters one adapter spans linear_qkv"):
        load_config("quickstart_nano", partial + ["policy.lora_cfg.fused_adapters=true"])
    with pytest.raises(ConfigError, match="fused_adapters=true: one adapter over a fused linear is Megatron's"):
        load_config("quickstart_nano", partial[:2] + ["policy.lora_cfg.fused_adapters=true",
                                                      "policy.backend=dtensor"])
    ok = load_config("quickstart_lora", [f"policy.model_name={tmp_path}/m", "policy.model_preset=tiny"])
    assert ok.policy.lora_cfg.enabled and ok.policy.lora_cfg.dim == 16 and len(ok.policy.lora_cfg.hf_targets()) == 7


# (~1 min each on 2 cores: the default suite keeps the sequence-parallel case, which adds the replicated factor's
# gradient sum over TP to the plain TP=2 case; that one runs in the slow target)
@pytest.mark.parametrize("sequence_parallel, layout", [pytest.param(False, "per-projection", marks=pytest.mark.slow),
                                                       (True, "per-projection"),
                                                       pytest.param(True, "subset", marks=pytest.mark.slow),
                                                       pytest.param(True, "fused", marks=pytest.mark.slow)])
def test_tensor_parallel_2_adapters_match_one_process(ray_cluster, nano, sequence_parallel, layout):
    """Ray TP=2 (A or B sharded as its base; with SP the replicated factor's gradient summed over TP) against the
    in-process TP=1 policy with the same initial adapters: logprobs, gradient norm and merged weights after a step
    within 1e-5 (test_parallel.py's harness), for Megatron's adapter layouts."""
    from tests.policy.test_parallel import check_against_reference, group_for, single_process_reference

    cfg = lora_cfg(nano, **LAYOUTS[layout])
    reference = single_process_reference(cfg)
    group = group_for(cfg, tp=2, sequence_parallel=sequence_parallel)
    try:
        check_against_reference(group, reference)
    finally:
        group.close()


def test_a_released_base_under_tensor_parallel_2_comes_back_exactly(ray_cluster, nano):
    """``release_base_while_generating`` in a Ray TP=2 group with SP: each rank frees its shard of the frozen base
    and reads it back from the model folder at its next pass; scores, the step and the merged weights match the
    in-process policy that never released (1e-5, test_parallel.py's harness), and an export from a released base
    (a refit's, layer by layer on each rank) equals one from the resident base."""
    from tests.policy.test_parallel import check_against_reference, group_for, max_diff, single_process_reference

    reference = single_process_reference(lora_cfg(nano))
    group = group_for(lora_cfg(nano, release_base_while_generating=True), tp=2, sequence_parallel=True)
    try:
        assert group.releases_base_while_generating and group.release_frozen_base() > 0
        check_against_reference(group, reference)
        resident = group.hf_state_dict()
        assert group.release_frozen_base() > 0
        assert max_diff(group.hf_state_dict(), resident) == 0
    finally:
        group.close()


def test_a_frozen_head_backward_folds_into_one_matmul(nano):
    """Megatron's frozen-weight linear computes its input gradient as ``grad_output.matmul(weight)``; the logits'
    gradient arrives as a transposed view ([t, b, vocab] of a [b, t, vocab] tensor), which torch.matmul cannot
    fold into one mm, so it broadcast the head's weight to [t, vocab, hidden]: 10.4 GB at t=35 for the Qwen3-0.6B
    head under adapters (measured). With the gradient made contiguous (and the fused head's into the decoder) no op
    of a LoRA train step makes a tensor larger than the step's logits or the model's largest weight."""
    from torch.utils._python_dispatch import TorchDispatchMode
    from torch.utils._pytree import tree_flatten

    sizes = []

    class Largest(TorchDispatchMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            out = func(*args, **(kwargs or {}))
            sizes.extend((t.numel(), str(func), tuple(t.shape)) for t in tree_flatten(out)[0]
                         if isinstance(t, torch.Tensor))
            return out

    policy = in_process_policy(lora_cfg(nano))
    try:
        batch = random_batch(b=8, t=20)
        vocab = policy.model.embedding.word_embeddings.weight.shape[0]
        weights = max(p.numel() for p in policy.model.parameters())
        with Largest():
            policy.train_step(batch, pg_token_mean_loss)
        largest = max(sizes)
        assert largest[0] <= max(8 * 20 * vocab, weights), largest  # (before: [t, vocab, hidden], 6x the logits)
    finally:
        policy.close()


def test_at_bf16_megatron_holds_the_frozen_base_once_in_bf16(nano):
    """Megatron at bf16 with adapters: the base is the compute copy's bf16 tensors (no fp32 master of a weight
    that never changes), so the distinct parameter tensors hold 2 bytes per base parameter plus the adapters
    twice (fp32 master + bf16 copy). After a step the base is still the folder's weights rounded to bf16, and the
    export (what the refit sends) is ``W + alpha/dim * B @ A`` on that base."""
    from rlkit.policy.architecture import load_hf_state
    from rlkit.policy.lora import merged
    from rlkit.policy.megatron.convert import split_qkv

    policy = in_process_policy(lora_cfg(nano, precision="bfloat16"))
    try:
        params = dict(policy.model.named_parameters())
        base = sum(p.numel() for n, p in params.items() if ".lora_" not in n)
        adapters = sum(p.numel() for n, p in params.items() if ".lora_" in n)
        distinct = {p.data_ptr(): p.numel() * p.element_size()
                    for p in [*policy.model.parameters(), *policy.adapter.twin.compute.parameters()]}
        assert sum(distinct.values()) == 2 * base + (4 + 2) * adapters
        assert {p.dtype for n, p in params.items() if ".lora_" not in n} == {torch.bfloat16}
        qkv = params["decoder.layers.0.self_attention.linear_qkv.weight"]
        before_qkv = qkv.detach().clone()
        trained(policy)
        hf = load_hf_state(str(nano))
        exported = {n: t.clone() for group in policy.export_hf_groups() for n, t in group}
        assert torch.equal(exported["model.norm.weight"], hf["model.norm.weight"].to(torch.bfloat16))  # not adapted
        stem = "decoder.layers.0.self_attention.linear_qkv.adapter"
        on_q, on_v = ({x: params[f"{stem}.lora_{x}.{p}_proj"].detach() for x in "AB"} for p in "qv")
        assert on_v["B"].abs().max() > 0
        q_base, _, v_base = split_qkv(qkv.detach(), policy.adapter.arch)
        q, v = (merged(w, f["A"], f["B"], policy.cfg.lora_cfg.scaling) for w, f in ((q_base, on_q), (v_base, on_v)))
        assert q.dtype == torch.bfloat16 and torch.equal(exported["model.layers.0.self_attn.q_proj.weight"], q)
        assert torch.equal(exported["model.layers.0.self_attn.v_proj.weight"], v)
        assert not torch.equal(q, hf["model.layers.0.self_attn.q_proj.weight"].to(torch.bfloat16))  # it moved
        assert torch.equal(qkv.detach(), before_qkv)  # the base did not
    finally:
        policy.close()


@pytest.mark.parametrize("backend", ["megatron", "dtensor"])
def test_reset_adapters_puts_back_the_adapters_it_started_with(nano, backend):
    """Session.reset() with adapters: the folder's base and the adapters as they started, so the run starts over
    (before, reset kept the trained adapters: a 'fresh' run went on from the trained policy)."""
    policy = in_process_policy(lora_cfg(nano, backend))
    try:
        start = dict(policy.export_adapter_tensors())
        trained(policy)
        moved = dict(policy.export_adapter_tensors())
        assert any(not torch.equal(moved[k], start[k]) for k in start)
        policy.reset_adapters()
        back = dict(policy.export_adapter_tensors())
        assert back.keys() == start.keys() and all(torch.equal(back[k], start[k]) for k in start)
    finally:
        policy.close()


def test_session_reset_with_adapters_scores_as_at_the_start(tmp_path):
    import rlkit

    overrides = {"policy.model_name": str(tmp_path / "model"), "logger.log_dir": str(tmp_path / "runs"),
                 "policy.lora_cfg.enabled": True, "policy.lora_cfg.dim": 4, "grpo.num_prompts_per_step": 4}
    with rlkit.Session.from_config("quickstart_nano", overrides) as s:
        batch = s.logprobs(s.rollout())
        s.sft(20, progress=False)  # trains the adapters
        assert not torch.equal(s.logprobs(batch).prev_logprobs, batch.prev_logprobs)
        s.reset()
        assert torch.equal(s.logprobs(batch).prev_logprobs, batch.prev_logprobs)  # the folder and fresh adapters
