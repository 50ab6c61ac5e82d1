"""Token-budget microbatches (``policy.dynamic_batching``): the plan, and equality with the fixed row-count path.

The reference is the same policy on the same weights and batch with dynamic batching off. Logprobs, the loss
and every gradient must agree within 1e-6 (fp32: only the grouping of rows into forward passes differs); the
entropy (values near 4.8) within 1e-6 of its scale, because the padded path alone moves it by 2.4e-6 when only
``logprob_batch_size`` changes (4 vs 12, DTensor, measured: a few float32 ulps from the matmul blocking); the weights after an optimizer step within 1e-5 (Adam divides by the root of the squared gradient,
which turns a 1e-7 difference of a near-zero gradient into up to lr x 1e-3); the step moves the weights by far
more than that (checked). With two data-parallel ranks whose rows need different numbers of microbatches, the
ranks must still run as many forward passes each (FSDP's forward is a collective), and the result must equal
one process's within test_parallel's 1e-5.
"""

import pytest
import torch

from rlkit.config.components import DynamicBatchingConfig, OptimizerConfig, PolicyConfig
from rlkit.errors import ConfigError
from rlkit.policy.factory import in_process_policy
from rlkit.policy.token_budget import padded_tokens, row_count_plan, split_to_count, token_budget_plan
from rlkit.trajectories import Trajectories
from tests.helpers import pg_token_mean_loss

TOL = 1e-6
STEP_TOL = 1e-5


def test_plan_covers_every_row_once_within_the_budget():
    lengths = [5, 40, 7, 33, 12, 40, 3, 20, 18, 9]
    plan = token_budget_plan(lengths, max_tokens=80)
    assert sorted(i for rows in plan for i in rows) == list(range(len(lengths)))
    for rows in plan:
        assert rows == sorted(rows)
        assert len(rows) * max(lengths[i] for i in rows) <= 80
    # longest rows together: the two 40s share a microbatch, the short ones fill another
    assert [1, 5] in plan
    assert padded_tokens(plan, lengths) < padded_tokens(row_count_plan(len(lengths), 2), lengths)


def test_plan_rounds_lengths_and_gives_an_oversized_row_its_own_microbatch():
    assert token_budget_plan([9, 9, 9], max_tokens=30, round_to=1) == [[0, 1, 2]]
    assert token_budget_plan([9, 9, 9], max_tokens=30, round_to=8) == [[0], [1], [2]]  # 2 x 16 > 30
    assert token_budget_plan([100, 2, 2], max_tokens=10) == [[0], [1, 2]]
    with pytest.raises(ValueError, match="max_tokens=0"):
        token_budget_plan([1], max_tokens=0)


def test_split_to_count_halves_the_largest_microbatch():
    assert split_to_count([[0, 1, 2, 3], [4]], 3) == [[0, 1], [2, 3], [4]]
    assert split_to_count([[0], [1]], 2) == [[0], [1]]
    with pytest.raises(ValueError, match="cannot split 2 rows into 3"):
        split_to_count([[0, 1]], 3)


def mixed_length_batch(lengths, t, vocab=100, prompt_len=4, seed=0) -> Trajectories:
    """A batch whose row ``i`` holds ``lengths[i]`` tokens (right-padded to ``t``), random advantages."""
    g = torch.Generator().manual_seed(seed)
    b = len(lengths)
    pos = torch.arange(t).unsqueeze(0)
    attention = pos < torch.tensor(lengths).unsqueeze(1)
    loss_mask = attention & (pos >= prompt_len)
    ids = torch.where(attention, torch.randint(3, vocab, (b, t), generator=g), 0)
    adv = torch.randn(b, 1, generator=g).expand(b, t) * loss_mask
    return Trajectories(prompts=("p",) * b, completions=("c",) * b, input_ids=ids, attention_mask=attention,
                        loss_mask=loss_mask, generator_logprobs=torch.zeros(b, t), finish_reasons=("stop",) * b,
                        group_size=1, policy_version=0, advantages=adv)


# rank 0 of a DP=2 split gets the first six rows (short: one microbatch of 48 tokens), rank 1 the last six
# (long: one row per microbatch under a 64-token budget)
LENGTHS = [8, 6, 7, 8, 5, 8, 40, 38, 33, 40, 36, 39]


@pytest.fixture(scope="module")
def model_cfg(model_factory):
    path = model_factory("nano", "qwen2", seed=5)
    return PolicyConfig(model_name=str(path), train_micro_batch_size=4, logprob_batch_size=4,
                        optimizer=OptimizerConfig(lr=1e-3))


def dynamic(cfg, **budget):
    return cfg.model_copy(update={"dynamic_batching": DynamicBatchingConfig(enabled=True, **budget)})


def run(policy, batch):
    """Scores, the loss without a step, the gradients (in-process policies), one train step, the weights after it."""
    try:
        scores = policy.logprobs(batch.input_ids, batch.attention_mask, with_entropy=True)
        loss = policy.evaluate_loss(batch, pg_token_mean_loss)["loss"]
        grads = None
        if hasattr(policy, "compute_gradients"):
            policy.compute_gradients(batch, pg_token_mean_loss)
            grads = {n: p.grad.full_tensor() if hasattr(p.grad, "full_tensor") else p.grad.clone()
                     for n, p in policy.model.named_parameters()}
        before = policy.hf_state_dict()
        step = policy.train_step(batch, pg_token_mean_loss)
        return dict(scores=scores, loss=loss, grads=grads, before=before, step=step, after=policy.hf_state_dict())
    finally:
        policy.close()


def assert_same(got, ref):
    assert (got["scores"].logprobs - ref["scores"].logprobs).abs().max() < TOL
    assert (got["scores"].entropy - ref["scores"].entropy).abs().max() < TOL * ref["scores"].entropy.abs().max()
    assert abs(got["loss"] - ref["loss"]) < TOL
    if got["grads"] is not None:
        assert max((got["grads"][k] - ref["grads"][k]).abs().max().item() for k in ref["grads"]) < TOL
    assert abs(got["step"].grad_norm - ref["step"].grad_norm) < TOL * ref["step"].grad_norm
    moved = max((ref["after"][k] - ref["before"][k]).abs().max().item() for k in ref["after"])
    assert moved > 100 * STEP_TOL
    assert max((got["after"][k] - ref["after"][k]).abs().max().item() for k in ref["after"]) < STEP_TOL


@pytest.mark.parametrize("backend", ["megatron", "dtensor"])
def test_token_budget_equals_the_padded_path(backend, model_cfg):
    cfg = model_cfg if backend == "megatron" else model_cfg.model_copy(update={"backend": "dtensor"})
    batch = mixed_length_batch(LENGTHS, t=48)
    ref = run(in_process_policy(cfg), batch)
    got = run(in_process_policy(dynamic(cfg, train_mb_tokens=64, logprob_mb_tokens=96, sequence_length_round=4)), batch)
    assert got["step"].num_microbatches == 7  # six long rows alone (2 x 36 > 64), the six short ones together (48)
    assert ref["step"].num_microbatches == 3
    assert_same(got, ref)


def test_two_ranks_with_different_plans_match_one_process(model_cfg, ray_cluster):
    """DTensor DP=2: rank 0's short rows fit one microbatch, rank 1's long rows need six; rank 0 splits its
    plan to six passes too, and the step equals the single process's without dynamic batching. (Without the
    equal count, rank 0's second FSDP all-gather never finds a partner: the test hangs, measured.)"""
    from rlkit.policy.workers import RayPolicyGroup

    assert [len(token_budget_plan(LENGTHS[rows], 64)) for rows in (slice(0, 6), slice(6, 12))] == [1, 6]
    cfg = model_cfg.model_copy(update={"backend": "dtensor"})
    batch = mixed_length_batch(LENGTHS, t=48)
    ref = run(in_process_policy(cfg), batch)
    got = run(RayPolicyGroup(dynamic(cfg, train_mb_tokens=64, logprob_mb_tokens=64), world_size=2, seed=0), batch)
    assert_same(got, ref)


def test_a_budget_smaller_than_a_sequence_is_refused_before_loading(tmp_path):
    from rlkit.config.loading import load_config

    with pytest.raises(ConfigError, match="policy.dynamic_batching.train_mb_tokens=32"):
        load_config("quickstart", ["policy.dynamic_batching.enabled=true", "policy.dynamic_batching.train_mb_tokens=32",
                                   "policy.max_total_sequence_length=64"])


def test_pipeline_parallelism_is_refused_before_loading():
    from rlkit.config.loading import load_config

    with pytest.raises(ConfigError, match=r"policy.dynamic_batching.enabled: not with pipeline parallelism"):
        load_config("quickstart", ["policy.dynamic_batching.enabled=true", "policy.num_workers=2",
                                   "policy.megatron_cfg.pipeline_model_parallel_size=2"])
