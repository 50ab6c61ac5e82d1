"""Sequence packing (``policy.sequence_packing``): the plan, packing and unpacking, the per-segment core attention,
and equality with the padded path.

The reference is the same policy on the same weights and batch without packing (fixed row-count microbatches,
each padded to its longest row). The tolerances are test_token_budget's, for the same reasons: logprobs, loss and
every gradient within 1e-6 (fp32: only the grouping of tokens into forward passes differs; measured 1.1e-8 for
the gradients), entropy within 1e-6 of its scale, the weights after an optimizer step within 1e-5 wherever the
gradient decided Adam's step (|g| above ~1e-6: the reference moved by over 0.99 lr). Where it did not, Adam's
first step (lr * g / (|g| + eps)) turns the gradient's rounding into the update itself: measured on Megatron,
one element of 12,288 in a down projection, whose gradient differs by ~1e-8 between the two paths, moved 1.03e-5
apart. If each row did not attend only within itself, the logprobs would be off by far more (checked below on
purpose). The batch holds a row of one token and a row that fills the whole train budget (48 tokens).
"""

import pytest
import torch

from rlkit.config.backends import MegatronConfig
from rlkit.config.components import OptimizerConfig, PolicyConfig, SequencePackingConfig
from rlkit.errors import ConfigError
from rlkit.policy.factory import in_process_policy
from rlkit.policy.packing import pack_rows, packed_tokens, packing_plan
from rlkit.policy.token_budget import padded_tokens, row_count_plan
from tests.policy.test_token_budget import STEP_TOL, TOL, mixed_length_batch, run

def assert_same(got, ref):
    """Packed results ``got`` against the padded ``ref`` (see the module docstring for the tolerances)."""
    assert (got["scores"].logprobs - ref["scores"].logprobs).abs().max() < TOL
    assert (got["scores"].entropy - ref["scores"].entropy).abs().max() < TOL * ref["scores"].entropy.abs().max()
    assert abs(got["loss"] - ref["loss"]) < TOL
    if got["grads"] is not None:  # (a worker group's gradients stay in its workers)
        assert max((got["grads"][k] - ref["grads"][k]).abs().max().item() for k in ref["grads"]) < TOL
    assert abs(got["step"].grad_norm - ref["step"].grad_norm) < TOL * ref["step"].grad_norm
    moved = max((ref["after"][k] - ref["before"][k]).abs().max().item() for k in ref["after"])
    assert moved > 100 * STEP_TOL
    # where Adam's first step was decided by the gradient: |g| / (|g| + eps) > 0.99, i.e. the reference moved by
    # more than 0.99 lr (no weight decay here); that is |g| > ~1e-6: 97.6% of the elements (the rest are mostly
    # embedding rows of tokens not in the batch, which do not move)
    lr = ref["step"].learning_rate
    decided = {k: (ref["after"][k] - ref["before"][k]).abs() > 0.99 * lr for k in ref["after"]}
    assert sum(int(m.sum()) for m in decided.values()) > 0.9 * sum(m.numel() for m in decided.values())
    assert max(((got["after"][k] - ref["after"][k]).abs() * decided[k]).max().item() for k in ref["after"]) < STEP_TOL


LENGTHS = [8, 1, 7, 30, 5, 48, 40, 12, 33, 3, 21, 36]  # a one-token row, a row filling the 48-token budget
WIDTH = 48


def test_plan_is_first_fit_decreasing_within_the_budget():
    lengths = [5, 40, 7, 33, 12, 40, 3, 20, 18, 9]
    plan = packing_plan(lengths, max_tokens=60)
    assert sorted(i for rows in plan for i in rows) == list(range(len(lengths)))
    assert all(sum(lengths[i] for i in rows) <= 60 for rows in plan)
    # longest first, each into the first pack with room: 40+20 | 40+18 | 33+12+9+5 | 7+3
    assert plan == [[1, 7], [5, 8], [0, 3, 4, 9], [2, 6]]
    assert packed_tokens(plan, lengths) == sum(lengths) < padded_tokens(row_count_plan(len(lengths), 2), lengths)
    assert packing_plan([100, 2, 2], max_tokens=10) == [[0], [1, 2]]  # too long for the budget: a pack of its own
    with pytest.raises(ValueError, match="max_tokens=0"):
        packing_plan([1], max_tokens=0)


def test_pack_rows_restarts_positions_and_unpack_puts_values_back():
    ids = torch.arange(1, 13).view(3, 4)
    packed = pack_rows(ids, [2, 4, 1], multiple_of=4)
    assert packed.input_ids.tolist() == [[1, 2, 5, 6, 7, 8, 9, 0]]  # filler of one pad token: 7 -> 8
    assert packed.position_ids.tolist() == [[0, 1, 0, 1, 2, 3, 0, 0]]
    assert packed.cu_seqlens.tolist() == [0, 2, 6, 7, 8]
    assert packed.max_seqlen == 4
    values = packed.input_ids.float().requires_grad_()
    rows = packed.unpack(values, width=5)
    # position 0 of each row and the padding hold 0 (the padded path's convention)
    assert rows.tolist() == [[0, 2, 0, 0, 0], [0, 6, 7, 8, 0], [0, 0, 0, 0, 0]]
    rows.sum().backward()
    assert values.grad.tolist() == [[0, 1, 0, 1, 1, 1, 0, 0]]


@pytest.mark.parametrize("kind", ["unfused", "sdpa"])
def test_packed_core_attention_equals_each_row_alone(kind):
    """Megatron's core attentions (the CPU's unfused one; SDPA, CUDA's, runs on the CPU too): a packed sequence
    [L, heads, hn] gives each row what the same module gives that row alone, and nothing of another row leaks in."""
    from megatron.core.packed_seq_params import PackedSeqParams
    from megatron.core.transformer.enums import AttnMaskType

    from rlkit.policy.megatron import parallel
    from rlkit.policy.megatron.attention import PackedDotProductAttention, SDPAttention
    from rlkit.policy.megatron.build import Architecture, transformer_config

    parallel.init_parallel(parallel.ParallelLayout(), seed=0)
    try:
        arch = Architecture(family="llama", hidden_size=128, num_layers=1, num_attention_heads=4, num_key_value_heads=2,
                            head_dim=32, ffn_hidden_size=256, vocab_size=64, max_position_embeddings=64,
                            rope_theta=1e4, rms_norm_eps=1e-6, tie_word_embeddings=False, qkv_bias=False)
        module = PackedDotProductAttention if kind == "unfused" else SDPAttention
        attention = module(transformer_config(arch), layer_number=1, attn_mask_type=AttnMaskType.causal,
                           attention_type="self")
        g = torch.Generator().manual_seed(0)
        lengths = [5, 1, 9, 5, 1]  # 5 and 1 share one call (rounded up to 8, as rows of a batch), 9 another
        q = torch.randn(sum(lengths), 4, 32, generator=g)
        k, v = (torch.randn(sum(lengths), 2, 32, generator=g) for _ in range(2))
        cu = torch.tensor([0, 5, 6, 15, 20, 21], dtype=torch.int32)
        params = PackedSeqParams(qkv_format="thd", cu_seqlens_q=cu, cu_seqlens_kv=cu, max_seqlen_q=9, max_seqlen_kv=9)
        packed = attention(q, k, v, None, packed_seq_params=params)
        assert packed.shape == (21, 1, 128)
        for s, e in zip(cu[:-1].tolist(), cu[1:].tolist()):
            alone = attention(q[s:e, None], k[s:e, None], v[s:e, None], None)
            assert (packed[s:e] - alone).abs().max() < 1e-6
        for i in (5, 20):  # a one-token row: its own value
            assert torch.allclose(packed[i, 0], v[i].repeat_interleave(2, 0).flatten())
        # the same sequence attended as one row differs (rows 2 and 3 would see row 1)
        whole = attention(q[:, None], k[:, None], v[:, None], None)
        assert (whole[5:] - packed[5:]).abs().max() > 1e-2
    finally:
        parallel.destroy_parallel()
        parallel.release_process_group()


@pytest.fixture(scope="module")
def model_cfg(model_factory):
    path = model_factory("nano", "qwen2", seed=5)
    return PolicyConfig(model_name=str(path), train_micro_batch_size=4, logprob_batch_size=4,
                        max_total_sequence_length=WIDTH, optimizer=OptimizerConfig(lr=1e-3))


def packing(cfg, **budget):
    return cfg.model_copy(update={"sequence_packing": SequencePackingConfig(enabled=True, **budget)})


def dtensor(cfg):
    return cfg.model_copy(update={"backend": "dtensor"})


@pytest.mark.parametrize("backend", ["megatron", "dtensor"])
def test_packed_equals_the_padded_path(backend, model_cfg):
    cfg = model_cfg if backend == "megatron" else dtensor(model_cfg)
    batch = mixed_length_batch(LENGTHS, t=WIDTH)
    ref = run(in_process_policy(cfg), batch)
    got = run(in_process_policy(packing(cfg, train_mb_tokens=WIDTH, logprob_mb_tokens=96)), batch)
    assert got["step"].num_microbatches == len(packing_plan(LENGTHS, WIDTH)) == 6
    assert_same(got, ref)


def test_rows_must_attend_only_within_themselves(model_cfg, monkeypatch):
    """The equality above can fail: the same packs attended as one sequence (one segment) score differently on
    the DTensor backend (Megatron's core attention: tested above). Positions running on across rows instead of
    restarting change nothing measurable (4.8e-7, measured): RoPE is relative, and an offset shared by a whole
    isolated segment cancels in its scores."""
    batch = mixed_length_batch(LENGTHS, t=WIDTH)
    policy = in_process_policy(packing(dtensor(model_cfg)))
    try:
        right = policy.logprobs(batch.input_ids, batch.attention_mask).logprobs

        def one_segment(packed):
            whole = torch.tensor([0, packed.input_ids.shape[1]], dtype=torch.int32)
            return policy.model(input_ids=packed.input_ids, position_ids=packed.position_ids, cu_seq_lens_q=whole,
                                use_cache=False).logits

        monkeypatch.setattr(policy.adapter, "packed_logits", one_segment)
        wrong = policy.logprobs(batch.input_ids, batch.attention_mask).logprobs
    finally:
        policy.close()
    assert (wrong - right).abs().max() > 1e-2


def test_packed_mixture_of_experts_equals_the_padded_path(model_factory):
    path = model_factory("nano-moe", "mixtral", seed=3)
    cfg = PolicyConfig(model_name=str(path), train_micro_batch_size=4, logprob_batch_size=4,
                       max_total_sequence_length=WIDTH, optimizer=OptimizerConfig(lr=1e-3))
    batch = mixed_length_batch(LENGTHS, t=WIDTH)
    assert_same(run(in_process_policy(packing(cfg, train_mb_tokens=WIDTH)), batch), run(in_process_policy(cfg), batch))


@pytest.mark.parametrize("sequence_parallel", [pytest.param(False, id="tp2", marks=pytest.mark.slow),
                                               pytest.param(True, id="tp2-sp")])  # SP's run covers TP too
def test_packed_tensor_parallel_equals_one_process(model_factory, ray_cluster, sequence_parallel):
    """TP=2 (2 processes, gloo) with packing against the single process without it; under sequence parallelism
    each pack is padded to an even length by a filler segment. test_parallel's tolerance for TP=2 (1e-5)."""
    from rlkit.policy.workers import RayPolicyGroup

    path = model_factory("nano", "qwen2", seed=1, num_key_value_heads=2)
    cfg = PolicyConfig(model_name=str(path), train_micro_batch_size=4, logprob_batch_size=4,
                       max_total_sequence_length=WIDTH, optimizer=OptimizerConfig(lr=1e-3))
    batch = mixed_length_batch(LENGTHS, t=WIDTH)
    ref = run(in_process_policy(cfg), batch)
    layout = MegatronConfig(tensor_model_parallel_size=2, sequence_parallel=sequence_parallel)
    got = run(RayPolicyGroup(packing(cfg, train_mb_tokens=WIDTH).model_copy(update={"megatron_cfg": layout}),
                             world_size=2, seed=0), batch)
    tol = 1e-5
    assert (got["scores"].logprobs - ref["scores"].logprobs).abs().max() < tol
    assert (got["scores"].entropy - ref["scores"].entropy).abs().max() < tol
    assert abs(got["loss"] - ref["loss"]) < tol
    assert abs(got["step"].grad_norm - ref["step"].grad_norm) < tol * ref["step"].grad_norm
    assert max((got["after"][k] - ref["after"][k]).abs().max().item() for k in ref["after"]) < tol


def test_two_ranks_with_different_pack_counts_match_one_process(model_cfg, ray_cluster):
    """DTensor DP=2: rank 0's six short rows fit one pack, rank 1's six long rows need six; rank 0 splits its
    plan to six passes too (FSDP's forward is a collective), and the step equals the single padded process's."""
    from rlkit.policy.workers import RayPolicyGroup

    lengths = [8, 1, 7, 12, 5, 9, 48, 40, 33, 30, 36, 21]
    assert [len(packing_plan(lengths[rows], WIDTH)) for rows in (slice(0, 6), slice(6, 12))] == [1, 6]
    cfg = dtensor(model_cfg)
    batch = mixed_length_batch(lengths, t=WIDTH)
    ref = run(in_process_policy(cfg), batch)
    got = run(RayPolicyGroup(packing(cfg, train_mb_tokens=WIDTH, logprob_mb_tokens=WIDTH), world_size=2, seed=0), batch)
    assert_same(got, ref)


@pytest.mark.parametrize("backend", ["megatron", "dtensor"])
def test_packed_bfloat16_is_within_test_precisions_bounds(backend, model_factory):
    """At policy.precision=bfloat16, packing against the fp32 padded policy within test_precision's bounds for the
    padded bf16 path (logprobs max 2e-2, mean 5e-3; gradient norm 2e-3 relative). Measured 2026-12-01 (nano
    Qwen3): packed bf16 vs fp32 4.1e-3 (Megatron; identical to padded bf16) / 3.2e-3 (DTensor; 2.0e-3 from padded
    bf16, itself 3.1e-3 from fp32)."""
    path = model_factory("nano", "qwen3", seed=2)
    cfg = PolicyConfig(model_name=str(path), train_micro_batch_size=4, logprob_batch_size=4,
                       max_total_sequence_length=WIDTH, optimizer=OptimizerConfig(lr=1e-3))
    cfg = cfg if backend == "megatron" else dtensor(cfg)
    batch = mixed_length_batch(LENGTHS, t=WIDTH)
    fp32 = run(in_process_policy(cfg), batch)
    bf16 = run(in_process_policy(packing(cfg).model_copy(update={"precision": "bfloat16"})), batch)
    gap = (bf16["scores"].logprobs - fp32["scores"].logprobs).abs()[batch.attention_mask]
    assert 1e-4 < gap.max() < 2e-2 and gap.mean() < 5e-3, (gap.max(), gap.mean())
    assert abs(bf16["step"].grad_norm - fp32["step"].grad_norm) < 2e-3 * fp32["step"].grad_norm


@pytest.mark.parametrize("overrides, message", [
    (["policy.dynamic_batching.enabled=true"], "exclusive with policy.dynamic_batching.enabled"),
    (["policy.sequence_packing.train_mb_tokens=32", "policy.max_total_sequence_length=64"],
     "policy.sequence_packing.train_mb_tokens=32: smaller than one sequence"),
    (["policy.num_workers=2", "policy.megatron_cfg.pipeline_model_parallel_size=2"], "not with pipeline parallelism"),
    (["policy.sequence_packing.algorithm=modified_first_fit_decreasing"], "first_fit_decreasing"),
    (["policy.num_workers=2", "policy.megatron_cfg.expert_model_parallel_size=2"], "not with expert parallelism"),
])
def test_what_packing_cannot_do_is_refused_before_loading(overrides, message):
    from rlkit.config.loading import load_config

    with pytest.raises(ConfigError, match=message):
        load_config("quickstart", ["policy.sequence_packing.enabled=true", *overrides])
