"""The Ray worker group with 2 processes on the CPU: TP=2 (with and without sequence parallelism), PP=2 (tied
and untied embeddings), DP=2 and, for the tiny MoE model, EP=2, TP=2 with SP and PP=2, against the
single-process policy.

The reference is the in-process TP=1 policy on the same weights and batch. Logprobs, entropy, the
gradient norm and the weights after one optimizer step must agree within 1e-5; the step moves the weights
by far more than that (checked), so a missing gradient all-reduce or a wrong shard would show.
One Ray cluster serves the whole module (the groups join it), and the DP=2 group is shared by the
equivalence test and the error tests, which break it last.
"""

import os

import pytest
import torch

from rlkit.config.backends import MegatronConfig
from rlkit.config.components import OptimizerConfig, PolicyConfig
from rlkit.errors import ConfigError
from rlkit.policy.megatron.policy import MegatronPolicy
from tests.helpers import pg_token_mean_loss, random_batch

ray = pytest.importorskip("ray")

TOL = 1e-5


def failing_loss(logprobs, batch, counts):
    raise ValueError("loss exploded on purpose")


def rank1_failing_loss(logprobs, batch, counts):
    """Rank 1 raises; rank 0 goes on into the gradient all-reduce and waits there for rank 1."""
    if torch.distributed.get_rank() == 1:
        raise ValueError("rank 1 loss exploded on purpose")
    return pg_token_mean_loss(logprobs, batch, counts)




@pytest.fixture(scope="module")
def model_cfg(model_factory):
    # two KV heads so that TP=2 is a valid layout; qwen2 adds the QKV bias to the sharded tensors
    path = model_factory("nano", "qwen2", seed=1, num_key_value_heads=2)
    return PolicyConfig(model_name=str(path), train_micro_batch_size=4, optimizer=OptimizerConfig(lr=1e-3))


def single_process_reference(cfg, make_policy=MegatronPolicy):
    """Results of the in-process policy: scores, one train step, the weights before and after it."""
    batch = random_batch(b=8, t=24)
    policy = make_policy(cfg)
    try:
        before = policy.hf_state_dict()
        scores = policy.logprobs(batch.input_ids, batch.attention_mask, with_entropy=True)
        step = policy.train_step(batch, pg_token_mean_loss)
        after = policy.hf_state_dict()
        groups = [[name for name, _ in g] for g in policy.export_hf_groups()]
    finally:
        policy.close()
    return dict(batch=batch, before=before, scores=scores, step=step, after=after, groups=groups)


@pytest.fixture(scope="module")
def reference(model_cfg):
    return single_process_reference(model_cfg)


def group_for(cfg, tp=1, sequence_parallel=False, pp=1, **megatron):
    from rlkit.policy.workers import RayPolicyGroup

    layout = MegatronConfig(tensor_model_parallel_size=tp, sequence_parallel=sequence_parallel,
                            pipeline_model_parallel_size=pp, **megatron)
    return RayPolicyGroup(cfg.model_copy(update={"megatron_cfg": layout}), world_size=2, seed=0)


def max_diff(a, b):
    return max((a[k] - b[k]).abs().max().item() for k in b)


def check_against_reference(group, ref):
    batch = ref["batch"]
    scores = group.logprobs(batch.input_ids, batch.attention_mask, with_entropy=True)
    assert (scores.logprobs - ref["scores"].logprobs).abs().max() < TOL
    assert (scores.entropy - ref["scores"].entropy).abs().max() < TOL
    assert max_diff(group.hf_state_dict(), ref["before"]) < TOL

    step = group.train_step(batch, pg_token_mean_loss)
    assert step.version == group.version == 1
    assert abs(step.grad_norm - ref["step"].grad_norm) < TOL * ref["step"].grad_norm
    assert abs(step.metrics["loss"] - ref["step"].metrics["loss"]) < TOL
    after = group.hf_state_dict()
    assert set(after) == set(ref["after"])
    assert max_diff(ref["after"], ref["before"]) > 100 * TOL  # the step moved the weights measurably
    assert max_diff(after, ref["after"]) < TOL
    assert [[name for name, _ in g] for g in group.export_hf_groups()] == ref["groups"]  # same fused groups


def test_tensor_parallel_2_matches_one_process(ray_cluster, model_cfg, reference):
    group = group_for(model_cfg, tp=2)
    try:
        assert [(r.dp_rank, r.leader) for r in group.ranks] == [(0, True), (0, False)]
        check_against_reference(group, reference)
    finally:
        group.close()


def test_sequence_parallel_with_tensor_parallel_2_matches_one_process(ray_cluster, model_cfg, reference):
    """The sequence split over the TP ranks between layers (norm gradients summed over them); lengths that are
    not a multiple of 2 are padded inside the forward pass."""
    group = group_for(model_cfg, tp=2, sequence_parallel=True)
    try:
        check_against_reference(group, reference)
    finally:
        group.close()


@pytest.mark.parametrize("sequence_parallel", [False, True], ids=["TP2", "TP2-SP"])
def test_fused_head_under_tensor_parallel_2_matches_one_process(ray_cluster, model_cfg, reference, sequence_parallel):
    """Megatron's head fused with the logprobs (rlkit.policy.megatron.head), forced at the nano size by chunks of
    3 tokens: the vocabulary-parallel log-sum-exp over the TP ranks, the hidden states' gradient reduced over them
    (all-reduce, or reduce-scatter under SP), against the single process's full logits."""
    from rlkit.models import read_hf_config

    chunk_mib = 4 * (read_hf_config(model_cfg.model_name)["vocab_size"] // 2) * 3 / 2**20  # 3 tokens a chunk per rank
    group = group_for(model_cfg, tp=2, sequence_parallel=sequence_parallel, fused_head_chunk_mib=chunk_mib)
    try:
        check_against_reference(group, reference)
    finally:
        group.close()


def test_pipeline_parallel_2_matches_one_process(ray_cluster, model_cfg, reference):
    """One decoder layer per stage, Megatron's 1F1B schedule over 2 microbatches."""
    group = group_for(model_cfg, pp=2)
    try:
        assert [(r.dp_rank, r.leader) for r in group.ranks] == [(0, True), (0, False)]
        check_against_reference(group, reference)
    finally:
        group.close()


def test_pipeline_parallel_2_with_tied_embeddings(ray_cluster, model_factory):
    """The embedding (first stage) and the output layer (last stage) are one weight: the step keeps them so."""
    path = model_factory("nano", "llama", seed=2, tie_word_embeddings=True)
    cfg = PolicyConfig(model_name=str(path), train_micro_batch_size=4, optimizer=OptimizerConfig(lr=1e-3))
    reference = single_process_reference(cfg)
    group = group_for(cfg, pp=2)
    try:
        check_against_reference(group, reference)
        batch = reference["batch"]  # after the step the last stage's output layer still equals the embedding
        scores = group.logprobs(batch.input_ids, batch.attention_mask).logprobs
        exported = group.hf_state_dict()
        solo = MegatronPolicy(cfg)
        try:
            solo.load_hf_state(exported)
            assert (solo.logprobs(batch.input_ids, batch.attention_mask).logprobs - scores).abs().max() < TOL
        finally:
            solo.close()
    finally:
        group.close()


@pytest.fixture(scope="module")
def moe_cfg(model_factory):
    path = model_factory("nano-moe", "mixtral", seed=1, num_key_value_heads=2)  # 4 experts, top-2; TP=2 valid
    # Adam's eps at 1e-6: an expert that few tokens reach has gradient elements near 1e-8, where Adam's first step
    # (lr * g / (|g| + eps)) turns a summation-order difference of 1e-10 in g into 1e-5 in the weight (measured:
    # 1.1e-5 to 1.4e-5 on experts.1.w3 under TP=2 with SP); every gradient well above 1e-6 still moves its weight by about lr
    return PolicyConfig(model_name=str(path), train_micro_batch_size=4, optimizer=OptimizerConfig(lr=2e-3, eps=1e-6))


@pytest.fixture(scope="module")
def moe_reference(moe_cfg):
    from rlkit.policy.backends import in_process_policy

    ref = single_process_reference(moe_cfg, in_process_policy)  # (the MoE adapter for an MoE folder)
    moved = max((ref["after"][k] - ref["before"][k]).abs().max().item() for k in ref["after"] if ".experts." in k)
    assert moved > 50 * TOL  # Adam moves each expert weight by about lr = 2e-3
    return ref


@pytest.mark.parametrize("layout", [
    dict(),  # DP=2: every expert on both ranks, gradients summed
    dict(expert_model_parallel_size=2),  # 2 experts per rank, DP=2 over the rest of the model
    dict(tensor_model_parallel_size=2, sequence_parallel=True),  # every expert split over TP=2 (ETP=2)
    dict(pipeline_model_parallel_size=2),  # one MoE layer per stage
], ids=["DP2", "EP2", "TP2-SP", "PP2"])
def test_moe_parallel_layouts_match_one_process(ray_cluster, moe_cfg, moe_reference, layout):
    from rlkit.policy.workers import RayPolicyGroup

    group = RayPolicyGroup(moe_cfg.model_copy(update={"megatron_cfg": MegatronConfig(**layout)}), world_size=2, seed=0)
    try:
        check_against_reference(group, moe_reference)
    finally:
        group.close()


@pytest.fixture(scope="module")
def dp_group(ray_cluster, model_cfg):
    group = group_for(model_cfg, tp=1)
    yield group
    group.close()


def test_data_parallel_2_matches_one_process(dp_group, reference):
    assert [(r.dp_rank, r.leader) for r in dp_group.ranks] == [(0, True), (1, True)]
    threads = max(1, os.cpu_count() // 2)
    assert all(r.omp_num_threads == str(threads) and r.torch_threads == threads for r in dp_group.ranks)
    assert len({r.pid for r in dp_group.ranks}) == 2
    check_against_reference(dp_group, reference)

    # scoring pads an odd batch across the ranks and gives the rows back in order
    batch = reference["batch"]
    five = dp_group.logprobs(batch.input_ids[:5], batch.attention_mask[:5]).logprobs
    whole = dp_group.logprobs(batch.input_ids, batch.attention_mask).logprobs
    assert five.shape == (5, batch.input_ids.shape[1]) and (five - whole[:5]).abs().max() < TOL
    with pytest.raises(ValueError, match="multiple of 2"):
        dp_group.train_step(batch.select(slice(0, 7)), pg_token_mean_loss)


def test_worker_exception_comes_back_with_its_traceback(dp_group):
    from rlkit.policy.workers import WorkerError

    batch = random_batch(b=4, t=16)
    with pytest.raises(WorkerError) as info:
        dp_group.train_step(batch, failing_loss)
    message = str(info.value)
    assert "failed in train_step()" in message and "loss exploded on purpose" in message
    assert "traceback" in message and 'test_parallel.py", line' in message and "in failing_loss" in message
    assert isinstance(info.value.cause, ValueError)
    # every rank failed at the same point, so the group is still in step and usable
    version = dp_group.version
    dp_group.train_step(batch, pg_token_mean_loss)
    assert dp_group.version == version + 1

    with pytest.raises(WorkerError, match="rank 1 of 2 failed in train_step"):
        dp_group.train_step(batch, rank1_failing_loss)  # rank 0 is left waiting in the all-reduce
    with pytest.raises(WorkerError, match="broken"):
        dp_group.logprobs(batch.input_ids, batch.attention_mask)
    dp_group.close()  # kills the stuck rank; the fixture's second close() is a no-op
    assert "closed" in repr(dp_group)


def rank1_dying_loss(logprobs, batch, counts):
    """Rank 1's process dies (a segfault or the OOM killer looks the same from outside)."""
    if torch.distributed.get_rank() == 1:
        os._exit(1)
    return pg_token_mean_loss(logprobs, batch, counts)


def test_a_worker_that_dies_is_reported_and_the_group_still_closes(ray_cluster, model_cfg):
    from rlkit.policy.workers import WorkerError

    group = group_for(model_cfg)
    batch = random_batch(b=4, t=16)
    with pytest.raises(WorkerError, match="rank 1 of 2 died in train_step") as info:
        group.train_step(batch, rank1_dying_loss)
    assert info.value.rank == 1
    with pytest.raises(WorkerError, match="broken.*close"):
        group.logprobs(batch.input_ids, batch.attention_mask)
    group.close()  # rank 0, left waiting in the all-reduce, is killed
    assert "closed" in repr(group)


def test_bad_layout_is_rejected_before_any_worker_starts(monkeypatch, model_factory):
    """start_ray is replaced (a stand-in) only to prove that validation happens before Ray is touched."""
    from rlkit.policy import workers

    def must_not_start(*args, **kwargs):
        raise AssertionError("Ray was started for an invalid layout")

    monkeypatch.setattr(workers, "start_ray", must_not_start)
    nano = PolicyConfig(model_name=str(model_factory("nano", "llama")))  # 2 heads, 1 KV head
    with pytest.raises(ConfigError, match="num_key_value_heads=1"):
        workers.RayPolicyGroup(nano.model_copy(update={"megatron_cfg": MegatronConfig(tensor_model_parallel_size=2)}), 2)
    moe = PolicyConfig(model_name=str(model_factory("nano-moe", "mixtral", seed=1)))  # 4 experts
    with pytest.raises(ConfigError, match="expert_model_parallel_size=3: must divide num_local_experts=4"):
        workers.RayPolicyGroup(moe.model_copy(update={"megatron_cfg": MegatronConfig(expert_model_parallel_size=3)}), 3)
    with pytest.raises(ConfigError, match="expert x pipeline = 2 must divide the world size 3"):
        workers.RayPolicyGroup(moe.model_copy(update={"megatron_cfg": MegatronConfig(expert_model_parallel_size=2)}), 3)
    with pytest.raises(ConfigError, match="set policy.megatron_cfg.sequence_parallel=true"):
        workers.RayPolicyGroup(moe.model_copy(update={"megatron_cfg": MegatronConfig(tensor_model_parallel_size=2)}), 2)
    with pytest.raises(ConfigError, match="sequence_parallel: needs tensor_model_parallel_size > 1"):
        workers.RayPolicyGroup(moe.model_copy(update={"megatron_cfg": MegatronConfig(sequence_parallel=True)}), 2)
    with pytest.raises(ConfigError, match="pipeline_model_parallel_size=3: must divide num_hidden_layers=2"):
        workers.RayPolicyGroup(nano.model_copy(update={"megatron_cfg": MegatronConfig(pipeline_model_parallel_size=3)}), 3)
    with pytest.raises(ConfigError, match="context parallelism needs Transformer Engine"):
        workers.RayPolicyGroup(nano.model_copy(update={"megatron_cfg": MegatronConfig(context_parallel_size=2)}), 2)
    with pytest.raises(ConfigError, match="needs a Mixture-of-Experts model"):
        workers.RayPolicyGroup(nano.model_copy(update={"megatron_cfg": MegatronConfig(expert_model_parallel_size=2)}), 2)
    with pytest.raises(ConfigError, match="must divide the world size 3"):
        workers.RayPolicyGroup(nano.model_copy(update={"megatron_cfg": MegatronConfig(tensor_model_parallel_size=2)}), 3)


def test_config_checks_the_layout_against_the_number_of_workers(tmp_path, model_cfg):
    from rlkit.config.loading import load_config

    base = {"policy.model_name": str(tmp_path / "m"), "policy.model_preset": "nano", "sft.enabled": False}
    load_config("quickstart", dict(base, **{"policy.num_workers": 2}))  # DP=2 over 16 x 8 samples: fine
    with pytest.raises(ConfigError) as err:
        load_config("quickstart", dict(base, **{"policy.num_workers": 2, "grpo.num_prompts_per_step": 5,
                                                "grpo.num_generations_per_prompt": 3, "sft.enabled": True,
                                                "sft.batch_size": 9}))
    text = str(err.value)
    assert "policy.train_global_batch_size=15: must be a multiple of the data-parallel size 2" in text
    assert "sft.batch_size=9: must be a multiple of the data-parallel size 2" in text
    existing = dict(base, **{"policy.model_name": model_cfg.model_name, "policy.megatron_cfg.tensor_model_parallel_size": 2})
    with pytest.raises(ConfigError, match="must divide the world size 1"):
        load_config("quickstart", existing)
    load_config("quickstart", dict(existing, **{"policy.num_workers": 2}))  # TP=2 over 2 workers: fine
    pipelined = dict(base, **{"policy.num_workers": 4, "policy.megatron_cfg.pipeline_model_parallel_size": 2,
                              "grpo.num_prompts_per_step": 4, "grpo.num_generations_per_prompt": 6})
    load_config("quickstart", dict(pipelined, **{"policy.train_micro_batch_size": 6}))  # 12 rows per DP rank: fine
    with pytest.raises(ConfigError, match="policy.train_global_batch_size=24: each data-parallel rank's 12 rows must be "
                                          "a multiple of policy.train_micro_batch_size=8"):
        load_config("quickstart", dict(pipelined, **{"policy.train_micro_batch_size": 8}))


@pytest.mark.parametrize("pipeline_stages", [1, 2], ids=["DP2", "PP2"])
def test_grpo_step_through_the_session_with_a_ray_policy(ray_cluster, tmp_path, pipeline_stages):
    import rlkit
    from rlkit.policy.workers import RayPolicyGroup
    from tests.session.conftest import tiny_overrides, varied_reward
    from rlkit.envs import RewardFunctionEnvironment

    overrides = tiny_overrides(tmp_path, **{"policy.num_workers": 2,
                                            "policy.megatron_cfg.pipeline_model_parallel_size": pipeline_stages})
    session = rlkit.Session.from_config("quickstart", overrides, env=RewardFunctionEnvironment(varied_reward))
    try:
        assert isinstance(session.policy, RayPolicyGroup) and session.policy.dp_size == 2 // pipeline_stages
        metrics = session.step()
        batch = session.batch
        assert batch.batch_size == 16 and session.policy.version == 1 and not session.stale
        # trainer logprobs came back from two ranks in row order (or from the last stage): they match the generator's
        assert abs(batch.info["token_mult_prob_error"] - 1.0) < 1e-3
        assert metrics["train/grad_norm"] > 0 and "train/loss" in metrics.values
        assert session.last_refit.num_tensors == len(session.policy.hf_state_dict())
    finally:
        session.close()


def test_dtensor_policy_runs_data_parallel_in_the_group(ray_cluster, model_cfg, reference):
    """FSDP2 over 2 ranks: the batch is split, gradients summed, parameters sharded across the processes.
    Compared with the single-process Megatron reference at the DTensor-vs-Megatron tolerances."""
    from rlkit.policy.workers import RayPolicyGroup

    cfg = model_cfg.model_copy(update={"backend": "dtensor"})
    group = RayPolicyGroup(cfg, world_size=2, seed=0)
    try:
        assert [(r.dp_rank, r.dp_size) for r in group.ranks] == [(0, 2), (1, 2)]
        batch = reference["batch"]
        scores = group.logprobs(batch.input_ids, batch.attention_mask, with_entropy=True)
        assert (scores.logprobs - reference["scores"].logprobs).abs().max() < 1e-4
        step = group.train_step(batch, pg_token_mean_loss)
        assert abs(step.grad_norm - reference["step"].grad_norm) < 1e-5 * reference["step"].grad_norm
        after = group.hf_state_dict()
        assert set(after) == set(reference["after"]) and max_diff(after, reference["after"]) < 1e-4
    finally:
        group.close()
