"""The per-token variant of evaluate_loss (rlkit.policy.per_token) and the gradient read without a step
(rlkit.policy.snapshots), on every in-process backend: Megatron-Core, DTensor (FSDP2) and plain transformers.

Independent references: each backend's own microbatched ``evaluate_loss`` (the per-token contributions must add up
to its loss, and the metrics agree, 1e-6), a hand-written REINFORCE token-mean loss (-A_t logp_t / N per token),
the backend's ``train_step`` (the gradient norm read without a step is the one the step reports, 1e-6; the
weights are untouched by the read and changed by the step), and the other backends (the same model's gradients
under four losses make the same pairwise angles on each, 1e-5)."""

import pytest
import torch

from rlkit.algorithms import LossParams, RLLoss
from rlkit.config.backends import MegatronConfig
from rlkit.config.components import OptimizerConfig, PolicyConfig
from rlkit.policy.backends import in_process_policy
from rlkit.policy.per_token import evaluate_loss_per_token
from rlkit.policy.snapshots import capture_state, capture_weights, gradient, load_state
from tests.helpers import random_batch

TOL = 1e-6
COSINES = {}  # backend -> pairwise gradient cosines of LOSSES: every backend must find the same angles


@pytest.fixture(scope="module")
def model_cfg(model_factory):
    path = model_factory("nano", "qwen2", seed=3, num_key_value_heads=2)  # test_contract.py's model: made once
    return PolicyConfig(model_name=str(path), train_micro_batch_size=3, logprob_batch_size=4,
                        optimizer=OptimizerConfig(lr=1e-3))


def build(backend, cfg):
    if backend == "megatron":
        return in_process_policy(cfg)
    if backend == "dtensor":
        return in_process_policy(cfg.model_copy(update={"backend": "dtensor"}))
    return in_process_policy(cfg.model_copy(update={"backend": "hf"}))


def off_policy_batch(policy):
    """A batch whose old and reference logprobs differ from the policy's, so ratios, clips and KL are not trivial."""
    batch = random_batch(b=8, t=24, seed=2, group_size=2)
    g = torch.Generator().manual_seed(7)
    now = policy.logprobs(batch.input_ids, batch.attention_mask).logprobs
    noise = lambda scale: torch.randn(now.shape, generator=g) * scale * batch.loss_mask  # noqa: E731
    return batch.with_(prev_logprobs=(now + noise(0.3)) * batch.loss_mask, ref_logprobs=(now + noise(0.5)) * batch.loss_mask,
                       generator_logprobs=(now + noise(0.1)) * batch.loss_mask)


LOSSES = {
    "ppo_clip+kl": LossParams(reference_policy_kl_penalty=0.1),
    "gspo": LossParams(policy_loss="gspo", ratio_clip_min=3e-4, ratio_clip_max=4e-4, aggregation="seq_mean_token_mean"),
    "cispo+tis": LossParams(policy_loss="cispo", off_policy_correction="tis", tis_cap=1.5),
    "reinforce": LossParams(policy_loss="reinforce"),
}


@pytest.mark.parametrize("backend", ["megatron", "dtensor", "hf"])
def test_per_token_loss_and_gradient_agree_with_the_backend(backend, model_cfg):
    policy = build(backend, model_cfg)
    try:
        batch = off_policy_batch(policy)
        for name, params in LOSSES.items():
            fn = RLLoss(params)
            whole = policy.evaluate_loss(batch, fn)
            tokens = evaluate_loss_per_token(policy, batch, fn)
            assert abs(float(tokens.values["loss"].sum()) - whole["loss"]) <= TOL, name
            assert all(abs(tokens.metrics[k] - v) <= TOL for k, v in whole.items()), name
            outside = ~batch.loss_mask
            assert all(float(v[outside].abs().max()) == 0 for v in tokens.values.values()), name
        clipped = evaluate_loss_per_token(policy, batch, RLLoss(LOSSES["ppo_clip+kl"])).values["clipped"]
        assert 0 < float(clipped.sum()) < int(batch.loss_mask.sum())  # some tokens clipped, not all
        # REINFORCE, token mean, by hand: -A_t logp_t / N on each completion token
        reinforce = evaluate_loss_per_token(policy, batch, RLLoss(LOSSES["reinforce"]))
        by_hand = -batch.advantages * reinforce.values["logprob"] / int(batch.loss_mask.sum())
        assert torch.allclose(reinforce.values["loss"], by_hand * batch.loss_mask, atol=1e-7, rtol=0)

        # the gradient read without a step is the step's own, and changes nothing
        fn = RLLoss(LOSSES["ppo_clip+kl"])
        before = capture_state(policy)
        read = gradient(policy, batch, fn)
        after = capture_weights(policy)
        assert all(torch.equal(before.weights[n], after[n]) for n in after)
        assert all(p.grad is None for p in policy.model.parameters())
        assert abs(read.cosine(read) - 1) < 1e-12
        step = policy.train_step(batch, fn)
        assert abs(step.grad_norm - read.norm) <= TOL * step.grad_norm
        assert abs(step.metrics["loss"] - read.metrics["loss"]) <= TOL
        assert policy.version == 1 and not torch.equal(capture_weights(policy)[next(iter(after))], after[next(iter(after))])
        grads = {name: gradient(policy, batch, RLLoss(params)) for name, params in LOSSES.items()}
        COSINES[backend] = {(a, b): grads[a].cosine(grads[b]) for a in grads for b in grads if a < b}
        for other, cosines in COSINES.items():  # independent implementations of the same model agree
            assert all(abs(cosines[k] - v) < 1e-5 for k, v in COSINES[backend].items()), (backend, other)
        # a state put back is the state taken, bit for bit (a second step repeats the first exactly)
        load_state(policy, before)
        assert policy.version == 0
        again = policy.train_step(batch, fn)
        assert again.grad_norm == step.grad_norm and again.metrics == step.metrics
    finally:
        policy.close()


def test_with_adapters_a_snapshot_is_the_adapters_and_replays_the_step(model_cfg):
    """Megatron with LoRA: the state a snapshot copies is the adapters alone (a small fraction of the weights),
    and a gradient read at a snapshot swapped in is the one the step from that snapshot reports."""
    from rlkit.config.components import LoraConfig
    from rlkit.policy.snapshots import trainable_bytes, weights_swapped_in

    policy = in_process_policy(model_cfg.model_copy(update={"lora_cfg": LoraConfig(enabled=True, dim=2)}))
    try:
        batch = off_policy_batch(policy)
        fn = RLLoss(LOSSES["ppo_clip+kl"])
        snapshot = capture_weights(policy)
        every = sum(p.numel() * p.element_size() for p in policy.model.parameters())
        assert snapshot and trainable_bytes(policy) < every / 4
        assert all(not p.requires_grad for n, p in policy.model.named_parameters() if n not in snapshot)
        step = policy.train_step(batch, fn)  # the adapters move (B starts at 0, so only B moves at first)
        assert not all(torch.equal(snapshot[n], w) for n, w in capture_weights(policy).items())
        with weights_swapped_in(policy, snapshot):
            read = gradient(policy, batch, fn)
        assert abs(read.norm - step.grad_norm) <= TOL * step.grad_norm
    finally:
        policy.close()


@pytest.mark.slow
def test_per_token_loss_on_a_two_rank_ray_group(model_cfg, ray_cluster):
    """The 2-rank Ray group (Megatron, TP=2): the per-token maps come from the group's logprobs and add up to the
    group's own evaluate_loss; compare_losses gives maps without gradients (the weights live in the workers)."""
    from rlkit.policy.workers import RayPolicyGroup
    from rlkit.stages.compare import compare_losses

    group = RayPolicyGroup(model_cfg.model_copy(update={"megatron_cfg": MegatronConfig(tensor_model_parallel_size=2)}),
                           world_size=2)
    try:
        batch = off_policy_batch(group)
        for name, params in LOSSES.items():
            whole = group.evaluate_loss(batch, RLLoss(params))
            tokens = evaluate_loss_per_token(group, batch, RLLoss(params))
            assert abs(float(tokens.values["loss"].sum()) - whole["loss"]) <= TOL, name
        comparison = compare_losses(batch, group, {n: RLLoss(p) for n, p in LOSSES.items()})
        assert comparison.grad_norms == {} and set(comparison.losses) == set(LOSSES)
    finally:
        group.close()


def test_a_cosine_stays_within_minus_one_and_one():
    """Equal gradients' float64 sums can round their cosine to 1 + 2e-16 (compare_losses met it: ppo_clip and cispo
    give the same gradient at ratio 1); opposite ones to -1 - 2e-16."""
    from rlkit.policy.snapshots import Gradient

    g = {"w": torch.randn(7, generator=torch.Generator().manual_seed(3))}  # unclamped: 1.0000000000000002
    same, opposite = Gradient({}, 1.0, g), Gradient({}, 1.0, {"w": -g["w"]})
    assert same.cosine(same) == 1.0 and same.cosine(opposite) == -1.0
    assert torch.isnan(torch.tensor(same.cosine(Gradient({}, 0.0, {"w": torch.zeros(7)}))))
