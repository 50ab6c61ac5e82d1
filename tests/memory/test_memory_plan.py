"""The memory plan's arithmetic by hand for a tiny config, its refusal (with the table and the switches), the
CLI, and (slow) the plan against measured peak RSS of short runs (bench/memory_plan.py)."""

import pytest

from rlkit.config.loading import load_config
from rlkit.memory.plan import GIB, RUNTIME_CPU_BYTES, Device, MemoryPlanError, plan_memory

# a hand-countable Llama: vocab 64, hidden 8, 2 layers, 2 heads of 4, 1 KV head, ffn 16, untied head
HF = dict(model_type="llama", vocab_size=64, hidden_size=8, intermediate_size=16, num_hidden_layers=2,
          num_attention_heads=2, num_key_value_heads=1, head_dim=4, tie_word_embeddings=False,
          max_position_embeddings=128)
CPU = Device("cpu", 100 * GIB, "test CPU")


@pytest.fixture(scope="module")
def folder(model_factory):
    return str(model_factory("nano", "llama"))


def config(folder, *more):
    return load_config("quickstart", [f"policy.model_name={folder}", "policy.model_preset=null",
                                      "policy.train_micro_batch_size=2", "policy.logprob_batch_size=2",
                                      "policy.max_total_sequence_length=16", *more])


def test_the_plan_adds_up_by_hand(folder):
    plan = plan_memory(config(folder), HF, CPU)
    # parameters: embed 64*8 + head 64*8 + final norm 8 + per layer (q 8*8, k 8*4, v 8*4, o 8*8, mlp 3*8*16, 2 norms 2*8)
    layer = 64 + 32 + 32 + 64 + 384 + 16
    params = 2 * 512 + 8 + 2 * layer
    p = plan.parts
    assert p["weights"] == 4 * params and p["gradients"] == 4 * params and p["optimizer state"] == 8 * params
    assert p["reference"] == 0 and p["adapters"] == 0 and p["bf16 twin"] == 0  # quickstart: no KL, fp32
    # activations: 2 rows x 16 tokens x (6h + 3(q + 2kv) + q + 4f) + 2 heads x 2 x 16^2 scores per row, x 2 layers, fp32
    per_token = 6 * 8 + 3 * (8 + 2 * 4) + 8 + 4 * 16
    assert p["activations"] == 2 * (16 * per_token + 2 * 2 * 16 * 16) * 4 * 2
    assert p["logits"] == 4 * 2 * 16 * 64 * 4  # logits, scaled, log-softmax, gradient of 2 rows (> 2 logprob rows x 2)
    # past one chunk of logits, Megatron's fused head: logits, softmax and gradient of a chunk, the head's gradient
    fused = plan_memory(config(folder), dict(HF, vocab_size=2**20), CPU).parts
    assert fused["logits"] == 3 * 64 * 2**20 + 2**20 * 8 * 4  # policy.megatron_cfg.fused_head_chunk_mib: 64
    assert p["optimizer step"] == 4 * params  # AdamW's temporaries
    # the engine: every parameter in fp32, its output head's CPU kernel (a packed copy of the 64 x 8 table), and the
    # input embedding's while it loads
    assert p["engine weights"] == 4 * params + 2 * 4 * 64 * 8
    assert p["KV cache"] == int(0.125 * GIB) and p["runtime"] == RUNTIME_CPU_BYTES
    assert plan.total == sum(p.values()) and plan.fits


def test_an_engine_that_releases_its_weights_counts_only_what_exceeds_the_train_steps_transients(folder):
    base = plan_memory(config(folder), HF, CPU).parts
    released = plan_memory(config(folder, "policy.generation.vllm_cfg.release_weights_for_training=true"), HF, CPU)
    transients = base["activations"] + base["logits"] + base["optimizer step"] + base["gradients"]  # (freed at refits)
    assert released.parts["engine weights"] == max(0, base["engine weights"] - transients)
    assert "released while training" in released.table()
    # with adapters and the frozen base released while the engine generates, the two never coexist either (a wider
    # model, whose weights outweigh a step's transients)
    wide = dict(HF, hidden_size=256, intermediate_size=512, head_dim=128)
    adapters = ["policy.lora_cfg.enabled=true", "policy.generation.vllm_cfg.release_weights_for_training=true",
                "policy.precision=bfloat16"]  # (the base held once in bf16, the engine in fp32: it holds more)
    lora = plan_memory(config(folder, *adapters), wide, CPU).parts
    both = plan_memory(config(folder, *adapters, "policy.lora_cfg.release_base_while_generating=true"), wide, CPU)
    assert lora["engine weights"] > both.parts["weights"] > 0
    assert both.parts["engine weights"] == lora["engine weights"] - both.parts["weights"]
    assert "and the frozen base" in both.table()


def test_the_plan_releases_the_engine_exactly_where_the_engine_decides_to(folder):
    """The plan and the engine read one decision (rlkit.config.engines.engine_handoff): an engine in its own Ray actor
    releases nothing whatever vllm_cfg.release_weights_for_training says, so the plan counts its whole copy; on a GPU
    the engine sleeps instead."""
    from rlkit.config.engines import engine_handoff

    release, separate = "policy.generation.vllm_cfg.release_weights_for_training=true", \
        "policy.generation.colocated.enabled=false"
    for more, expected in (((release,), "release_weights"), ((release, separate), "none")):
        cfg, kept = config(folder, *more), config(folder, *[m for m in more if m != release])
        decided = engine_handoff(cfg.policy.generation, cfg.generation_colocated, on_cpu=True, can_sleep=False)
        assert decided == expected
        engine, whole = (plan_memory(c, HF, CPU).parts["engine weights"] for c in (cfg, kept))
        assert (engine < whole) == (decided == "release_weights")  # the same copy when the engine releases nothing
    gpu = config(folder, release)
    assert engine_handoff(gpu.policy.generation, True, on_cpu=False, can_sleep=True) == "sleep"
    hf = config(folder, release, "policy.generation.backend=hf")
    assert engine_handoff(hf.policy.generation, True, on_cpu=True, can_sleep=False) == "none"


def test_kl_recompute_bf16_tp_and_adapters_change_their_parts(folder):
    base = plan_memory(config(folder), HF, CPU).parts
    kl = plan_memory(config(folder, "loss_fn.reference_policy_kl_penalty=0.01"), HF, CPU).parts
    assert kl["reference"] == base["weights"]
    bf16 = plan_memory(config(folder, "policy.precision=bfloat16"), HF, CPU).parts
    assert bf16["bf16 twin"] == base["weights"] // 2 and bf16["activations"] == base["activations"] // 2
    full = ["policy.megatron_cfg.recompute_granularity=full", "policy.megatron_cfg.recompute_method=uniform",
            "policy.megatron_cfg.recompute_num_layers=1"]
    recomputed = plan_memory(config(folder, *full), HF, CPU).parts
    assert recomputed["activations"] == base["activations"] // 2 + 2 * 16 * 8 * 4 * 2  # one layer + each input
    pure = plan_memory(config(folder, "policy.precision=bfloat16", "policy.optimizer.main_params_dtype=bfloat16"),
                       HF, CPU).parts
    assert pure["weights"] == base["weights"] // 2 and pure["bf16 twin"] == 0  # no masters, no second copy
    assert pure["gradients"] == pure["weights"] and pure["optimizer state"] == 2 * pure["weights"]
    lora = plan_memory(config(folder, "policy.lora_cfg.enabled=true", "policy.lora_cfg.dim=2",
                              "policy.megatron_cfg.enabled=false", "policy.hf_cfg.enabled=true"), HF, CPU).parts
    # rank 2 on q, k, v, o, gate, up, down: 2 x (in + out) each, 2 layers, fp32
    adapters = 2 * ((8 + 8) + (8 + 4) * 2 + (8 + 8) + (8 + 16) * 2 + (16 + 8)) * 2 * 4
    assert lora["adapters"] == adapters and lora["gradients"] == adapters and lora["optimizer state"] == 2 * adapters
    on_megatron = plan_memory(config(folder, "policy.lora_cfg.enabled=true", "policy.lora_cfg.dim=2"), HF, CPU).parts
    assert on_megatron["adapters"] == adapters  # one adapter per projection, as peft's
    fused = plan_memory(config(folder, "policy.lora_cfg.enabled=true", "policy.lora_cfg.dim=2",
                               "policy.lora_cfg.fused_adapters=true"), HF, CPU).parts
    assert fused["adapters"] == adapters - 2 * (8 * 2 + 8 * 1) * 2 * 4  # one A for q/k/v and one for gate/up
    partial = plan_memory(config(folder, "policy.lora_cfg.enabled=true", "policy.lora_cfg.dim=2",
                                 "policy.lora_cfg.target_modules=[q_proj,v_proj,linear_fc2]"), HF, CPU).parts
    assert partial["adapters"] == 2 * ((8 + 8) + (8 + 4) + (16 + 8)) * 2 * 4


def test_auto_kv_cache_holds_one_rollout_batch_at_full_length(folder):
    # the quickstart's 16 x 8 = 128 sequences of 16 tokens, each one 128-token block; per token K and V of 2 layers
    # x 1 KV head x 4 dims: 2 x 2 x 1 x 4 elements, 4 bytes in fp32 and 2 in bf16
    auto = ["policy.generation.vllm_cfg.kv_cache_space_gib=auto"]
    assert plan_memory(config(folder, *auto), HF, CPU).parts["KV cache"] == 128 * 128 * 16 * 4
    bf16 = config(folder, *auto, "policy.generation.vllm_cfg.precision=bfloat16", "grpo.num_prompts_per_step=4",
                  "policy.max_total_sequence_length=200")
    assert plan_memory(bf16, HF, CPU).parts["KV cache"] == 4 * 8 * 256 * 16 * 2  # 200 tokens take 2 blocks


def test_a_config_that_cannot_fit_is_refused_with_the_table_and_the_switches(folder):
    cfg = config(folder)
    plan = plan_memory(cfg, HF, Device("cpu", 2**20, "a 1 MiB test device"))
    assert not plan.fits
    with pytest.raises(MemoryPlanError) as refused:
        plan.refuse_if_over(cfg)
    text = str(refused.value)
    assert "memory plan per device" in text and "DOES NOT FIT" in text and "runtime" in text
    assert "policy.lora_cfg.enabled=true" in text and "policy.precision=bfloat16" in text
    assert "tensor_model_parallel_size" in text and "main_params_dtype=bfloat16" in text


def test_rlkit_plan_prints_the_table(folder, capsys):
    from rlkit.cli import main

    code = main(["plan", "quickstart", f"policy.model_name={folder}", "policy.model_preset=null"])
    out = capsys.readouterr().out
    assert code == 0 and "engine weights" in out and "total" in out


@pytest.mark.slow
def test_the_plan_is_within_15_percent_of_measured_peak_rss(tmp_path):
    from bench.memory_plan import folders, measure, planned

    bf16_lora = ["policy.precision=bfloat16", "policy.generation.vllm_cfg.precision=bfloat16",
                 "policy.lora_cfg.enabled=true"]  # the base held once, in bf16
    for size, folder in folders(["tiny", "qwen3-0.6b-4l"], tmp_path).items():
        for extra in ([], bf16_lora):
            plan, (peak, load) = planned(folder, extra), measure(folder, extra)
            assert abs(plan / peak - 1) <= 0.15, (size, extra, plan / 2**30, peak / 2**30, load)


def test_weight_snapshots_cost_what_trains_per_snapshot(folder):
    base = plan_memory(config(folder), HF, CPU).parts
    assert base["weight snapshots"] == 0  # full-weight snapshots are off by default
    full = plan_memory(config(folder, "history.full_weight_snapshots=true", "history.snapshots=3"), HF, CPU).parts
    assert full["weight snapshots"] == 3 * base["weights"]
    pure = plan_memory(config(folder, "policy.precision=bfloat16", "policy.optimizer.main_params_dtype=bfloat16"),
                       HF, CPU).parts
    assert pure["weights"] == base["weights"] // 2 and pure["bf16 twin"] == 0  # no masters, no second copy
    assert pure["gradients"] == pure["weights"] and pure["optimizer state"] == 2 * pure["weights"]
    lora = plan_memory(config(folder, "policy.lora_cfg.enabled=true", "policy.lora_cfg.dim=2",
                              "policy.megatron_cfg.enabled=false", "policy.hf_cfg.enabled=true"), HF, CPU).parts
    assert lora["weight snapshots"] == 4 * lora["adapters"]  # adapters: always kept, history.snapshots=4
