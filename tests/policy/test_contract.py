"""The backend contract (:class:`rlkit.policy.base.Policy`), every method, against every backend: the in-process
Megatron policy, the in-process DTensor policy, the plain transformers policy and a 2-rank Ray group (Megatron,
TP=2, so checkpoint shards differ per rank).

Independent references: logprobs against transformers' model of the same folder in float64 (bound 1e-4, fp32
policies); checkpoint state by replay: a step taken after loading a saved state must give bitwise-close
weights (1e-6) to the step taken right after saving, which fails if any optimizer moment, the schedule
position or the weights came back wrong.
"""

import pytest
import torch

from rlkit.config.backends import MegatronConfig
from rlkit.config.components import OptimizerConfig, PolicyConfig, SchedulerConfig
from rlkit.policy.architecture import load_hf_state
from rlkit.policy.backends import in_process_policy
from rlkit.policy.base import Policy
from rlkit.policy.state import CheckpointLayoutError
from tests.helpers import pg_token_mean_loss, random_batch

ray = pytest.importorskip("ray")

LOGPROB_TOL = 1e-4  # fp32 policy vs float64 transformers
REPLAY_TOL = 1e-6


@pytest.fixture(scope="module")
def model_cfg(model_factory):
    path = model_factory("nano", "qwen2", seed=3, num_key_value_heads=2)  # 2 KV heads: TP=2 is valid
    return PolicyConfig(model_name=str(path), train_micro_batch_size=4, logprob_batch_size=4,
                        optimizer=OptimizerConfig(lr=1e-3), scheduler=SchedulerConfig(warmup_steps=3))




def build(backend, cfg):
    if backend == "megatron":
        return in_process_policy(cfg)
    if backend == "dtensor":
        return in_process_policy(cfg.model_copy(update={"backend": "dtensor"}))
    if backend == "hf":
        return in_process_policy(cfg.model_copy(update={"backend": "hf"}))
    from rlkit.policy.workers import RayPolicyGroup

    return RayPolicyGroup(cfg.model_copy(update={"megatron_cfg": MegatronConfig(tensor_model_parallel_size=2)}),
                          world_size=2)


def hf_float64_logprobs(folder, batch):
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float64)
    with torch.no_grad():
        logits = model(input_ids=batch.input_ids).logits
    lp = torch.log_softmax(logits[:, :-1], -1).gather(-1, batch.input_ids[:, 1:, None]).squeeze(-1)
    return torch.nn.functional.pad(lp, (1, 0)) * batch.attention_mask


def max_diff(a, b):
    assert set(a) == set(b)
    return max((a[k].double() - b[k].double()).abs().max().item() for k in a)


@pytest.mark.parametrize("backend", ["megatron", "dtensor", "hf", "ray"])
def test_every_backend_implements_the_whole_contract(backend, model_cfg, ray_cluster, tmp_path):
    batch = random_batch(b=8, t=24, seed=1)
    ids, mask = batch.input_ids, batch.attention_mask
    initial = load_hf_state(model_cfg.model_name)
    policy = build(backend, model_cfg)
    try:
        assert isinstance(policy, Policy) and policy.version == 0
        # logprobs, entropy and reference logprobs; the reference starts as the loaded weights
        scores = policy.logprobs(ids, mask, with_entropy=True)
        assert (scores.logprobs - hf_float64_logprobs(model_cfg.model_name, batch)).abs().max() < LOGPROB_TOL
        assert scores.entropy.shape == ids.shape and bool((scores.entropy[:, 1:][mask[:, 1:]] > 0).all())
        assert torch.equal(policy.reference_logprobs(ids, mask).logprobs, scores.logprobs)
        # HF export: every tensor of the folder, names and values
        assert max_diff(policy.hf_state_dict(), initial) < 1e-7
        assert sum(len(g) for g in policy.export_hf_groups()) == len(initial)
        # a loss without a step changes nothing
        loss0 = policy.evaluate_loss(batch, pg_token_mean_loss)["loss"]
        assert policy.version == 0 and max_diff(policy.hf_state_dict(), initial) < 1e-7

        policy.save_state(tmp_path / "v0")
        first = policy.train_step(batch, pg_token_mean_loss)
        assert first.version == policy.version == 1 and abs(first.metrics["loss"] - loss0) < 1e-6
        after_one = policy.hf_state_dict()
        assert max_diff(after_one, initial) > 1e-4  # the step moved the weights
        assert policy.evaluate_loss(batch, pg_token_mean_loss)["loss"] < loss0  # and lowered the loss
        assert torch.equal(policy.reference_logprobs(ids, mask).logprobs, scores.logprobs)  # reference frozen

        # checkpoint replay: save at version 1, step to 2, load version 1, step again -> the same weights
        policy.save_state(tmp_path / "v1")
        policy.offload_optimizer_state()  # (as while a colocated engine generates; where weights are on the CPU
        second = policy.train_step(batch, pg_token_mean_loss)  # nothing moves) the step restores it by itself
        after_two = policy.hf_state_dict()
        policy.load_state(tmp_path / "v1")
        assert policy.version == 1 and max_diff(policy.hf_state_dict(), after_one) < REPLAY_TOL
        assert torch.equal(policy.reference_logprobs(ids, mask).logprobs, scores.logprobs)  # reference restored
        policy.offload_optimizer_state()
        policy.restore_optimizer_state()
        replay = policy.train_step(batch, pg_token_mean_loss)
        assert replay.learning_rate == second.learning_rate  # schedule position restored (warm-up: it differs per step)
        assert max_diff(policy.hf_state_dict(), after_two) < REPLAY_TOL  # Adam moments restored
        policy.load_state(tmp_path / "v0")  # a state saved before any step (no optimizer moments yet)
        assert policy.version == 0 and max_diff(policy.hf_state_dict(), initial) < REPLAY_TOL
        assert policy.train_step(batch, pg_token_mean_loss).learning_rate == first.learning_rate

        # reference snapshot, version counter, HF import, optimizer reset
        policy.set_reference_to_current()
        now = policy.logprobs(ids, mask).logprobs
        assert torch.equal(policy.reference_logprobs(ids, mask).logprobs, now)
        policy.version = 7
        assert policy.version == 7
        policy.load_hf_state(initial)
        assert (policy.logprobs(ids, mask).logprobs - scores.logprobs).abs().max() < 1e-6
        # a train step's own logprobs and entropy (Session.step() skips the logprobs pass with them)
        if policy.returns_step_logprobs:
            own = policy.train_step(batch, pg_token_mean_loss, return_logprobs=True)
            on_completion = lambda t: torch.where(batch.loss_mask, t, 0.0)  # noqa: E731
            assert (own.logprobs - on_completion(scores.logprobs)).abs().max() < 1e-6  # the same weights as scores
            assert (own.entropy - on_completion(scores.entropy)).abs().max() < 1e-6
            policy.load_hf_state(initial)
        else:
            with pytest.raises(ValueError, match="returns no logprobs"):
                policy.train_step(batch, pg_token_mean_loss, return_logprobs=True)
        assert backend == "ray" or policy.returns_step_logprobs
        policy.reset_optimizer(OptimizerConfig(lr=1e-12), SchedulerConfig())
        step = policy.train_step(batch, pg_token_mean_loss)
        assert step.learning_rate == 1e-12 and max_diff(policy.hf_state_dict(), initial) < 1e-6
    finally:
        policy.close()


def test_a_checkpoint_of_another_layout_is_refused_before_loading(model_cfg, ray_cluster, tmp_path):
    """Saved under TP=2 (2 ranks), loaded into one process: refused with both layouts named, nothing loaded."""
    group = build("ray", model_cfg)
    try:
        group.train_step(random_batch(b=8, t=24), pg_token_mean_loss)
        group.save_state(tmp_path / "tp2")
    finally:
        group.close()
    solo = build("megatron", model_cfg)
    try:
        before = solo.hf_state_dict()
        with pytest.raises(CheckpointLayoutError, match="tensor_model_parallel_size: 2 -> 1"):
            solo.load_state(tmp_path / "tp2")
        assert solo.version == 0 and max_diff(solo.hf_state_dict(), before) == 0
    finally:
        solo.close()
