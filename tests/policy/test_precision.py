"""policy.precision=bfloat16 on both in-process backends against the fp32 policy on the same weights.

Bounds (measured on this nano Qwen3, hidden 64, 8 rows x 24 tokens, 2026-11-30; each bound ~5x the figure):
- logprobs: fp32 policy vs a float64 transformers forward 4.8e-7 max (bound 1e-5); bf16 vs fp32 2.7e-3
  (Megatron) / 3.4e-3 (DTensor) max, ~1e-3 mean (bounds 2e-2 / 5e-3), and above 1e-4, so bf16 really ran.
- one AdamW step (lr 1e-3): gradient norm 1-2e-4 relative (bound 2e-3), loss 2-4e-4 (bound 2e-3), weight
  updates 0.7% of lr on average (bound 5%; single entries differ by up to 2 lr where a near-zero gradient
  entry flips sign, which Adam's first step turns into a full +-lr step).
"""

import pytest
import torch

from rlkit.config.components import OptimizerConfig, PolicyConfig
from rlkit.policy.dtensor import DTensorPolicy
from rlkit.policy.megatron.policy import MegatronPolicy
from rlkit.policy.precision import Bf16Twin
from tests.helpers import pg_token_mean_loss, random_batch

BACKENDS = {"megatron": MegatronPolicy, "dtensor": DTensorPolicy}


@pytest.fixture(scope="module")
def model_path(model_factory):
    return model_factory("nano", "qwen3", seed=1)


def make_policy(model_path, backend: str, precision: str, lr: float = 1e-3):
    cfg = PolicyConfig(model_name=str(model_path), precision=precision, train_micro_batch_size=4,
                       optimizer=OptimizerConfig(lr=lr), megatron_cfg={"enabled": backend == "megatron"},
                       dtensor_cfg={"enabled": backend == "dtensor"})
    return BACKENDS[backend](cfg)


def float64_reference_logprobs(model_path, batch) -> torch.Tensor:
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(model_path, dtype=torch.float64)
    with torch.no_grad():
        logp = torch.log_softmax(model(batch.input_ids).logits[:, :-1], -1)
    token = logp.gather(-1, batch.input_ids[:, 1:, None]).squeeze(-1)
    return torch.nn.functional.pad(token, (1, 0)).float() * batch.attention_mask


def weights_around_steps(policy, steps: int) -> tuple[dict, dict]:
    """The policy's HF weights before and after ``steps`` train steps on one random batch; the policy is closed."""
    batch = random_batch(b=8, t=24)
    try:
        before = policy.hf_state_dict()
        for _ in range(steps):
            policy.train_step(batch, pg_token_mean_loss)
        return before, policy.hf_state_dict()
    finally:
        policy.close()


def step_and_scores(model_path, backend: str, precision: str, batch):
    policy = make_policy(model_path, backend, precision)
    try:
        assert f", {precision}, " in repr(policy)  # the precision is shown wherever the policy is
        scores = policy.logprobs(batch.input_ids, batch.attention_mask).logprobs
        before = policy.hf_state_dict()
        step = policy.train_step(batch, pg_token_mean_loss)
        after = policy.hf_state_dict()
        reference = policy.reference_logprobs(batch.input_ids, batch.attention_mask).logprobs
    finally:
        policy.close()
    return scores, step, {k: after[k] - before[k] for k in before}, after, reference


@pytest.mark.parametrize("backend", sorted(BACKENDS))
def test_bf16_logprobs_and_train_step_match_fp32_within_bounds(model_path, backend):
    batch = random_batch(b=8, t=24)
    exact = float64_reference_logprobs(model_path, batch)
    fp32, fp32_step, fp32_update, _, _ = step_and_scores(model_path, backend, "float32", batch)
    bf16, bf16_step, bf16_update, bf16_after, bf16_reference = step_and_scores(model_path, backend, "bfloat16", batch)
    valid = batch.attention_mask

    assert (fp32 - exact)[valid].abs().max() < 1e-5
    gap = (bf16 - fp32)[valid].abs()
    assert 1e-4 < gap.max() < 2e-2 and gap.mean() < 5e-3, (gap.max(), gap.mean())
    assert (bf16[~valid] == 0).all()
    assert torch.equal(bf16_reference, bf16)  # the reference is the pre-step weights, scored in bf16 too

    assert abs(bf16_step.grad_norm - fp32_step.grad_norm) < 2e-3 * fp32_step.grad_norm
    assert abs(bf16_step.metrics["loss"] - fp32_step.metrics["loss"]) < 2e-3
    lr = 1e-3
    diff = sum((bf16_update[k] - fp32_update[k]).abs().sum().item() for k in fp32_update)
    assert diff / sum(u.numel() for u in fp32_update.values()) < 0.05 * lr
    assert all(t.dtype == torch.float32 for t in bf16_after.values())  # exported from the fp32 master weights


@pytest.mark.parametrize("backend", sorted(BACKENDS))
def test_updates_below_bf16_resolution_accumulate_in_the_fp32_master_weights(model_path, backend):
    """Five AdamW steps of lr=1e-4 move the fp32 master weights by up to 5e-4 each, to values bf16 cannot
    hold: weights kept in bf16 would show no such values (and lose most of these updates: near 1.0, the
    norm weights' scale, bf16 values are 2^-8 apart)."""
    before, after = weights_around_steps(make_policy(model_path, backend, "bfloat16", lr=1e-4), steps=5)
    moved = torch.cat([(after[k] - before[k]).flatten() for k in before]).abs()
    assert 4.5e-4 < moved.max() <= 5e-4 * 1.01, moved.max()  # five Adam steps of lr in one direction
    values = torch.cat([t.flatten() for t in after.values()])
    assert (values.to(torch.bfloat16).float() != values).float().mean() > 0.9


def test_bf16_twin_keeps_updates_a_pure_bf16_model_loses():
    """The mechanism alone, against the control that shows the problem: AdamW on bf16 weights of 1.0 with
    lr=1e-4 never moves them; with fp32 masters the bf16 copy moves once the updates add up to half a
    bf16 step (2^-8 above 1.0: after 40 steps). The bf16 gradient reaches the master in fp32 as the policy
    hands it over from Megatron's DDP buffer (tests/policy/test_megatron_ddp.py checks that part)."""
    torch.manual_seed(0)

    def model(dtype):
        layer = torch.nn.Linear(8, 8, bias=False, dtype=dtype)
        torch.nn.init.ones_(layer.weight)
        return layer

    master, compute, control = model(torch.float32), model(torch.bfloat16), model(torch.bfloat16)
    twin = Bf16Twin(master, compute)
    optimizer = torch.optim.AdamW(master.parameters(), lr=1e-4, weight_decay=0.0)
    control_optimizer = torch.optim.AdamW(control.parameters(), lr=1e-4, weight_decay=0.0)
    x = torch.randn(4, 8)
    for step in range(50):
        for layer in (compute, control):  # the gradient pushes every weight up: d(-sum(y))/dw < 0 for x > 0
            (-layer(x.abs().to(torch.bfloat16)).float().sum()).backward()
        master.weight.grad, compute.weight.grad = compute.weight.grad.float(), None
        optimizer.step(), control_optimizer.step()
        optimizer.zero_grad(), control_optimizer.zero_grad()
        twin.pull()
        if step == 0:
            assert (compute.weight == 1).all() and (master.weight > 1).all()
    assert torch.allclose(master.weight, torch.full_like(master.weight, 1 + 50e-4), atol=1e-5)
    assert (control.weight == 1).all()  # the bf16-only model lost every update
    assert (compute.weight == 1 + 2**-7).all()  # the nearest bf16 value to 1.005


def test_bf16_checkpoint_restores_the_fp32_masters_and_the_bf16_copy(model_path, tmp_path):
    batch = random_batch(b=8, t=24)
    policy = make_policy(model_path, "megatron", "bfloat16", lr=1e-4)
    try:
        policy.train_step(batch, pg_token_mean_loss)
        policy.save_state(tmp_path / "ckpt")
        saved, scores = policy.hf_state_dict(), policy.logprobs(batch.input_ids, batch.attention_mask).logprobs
    finally:
        policy.close()
    fresh = make_policy(model_path, "megatron", "bfloat16", lr=1e-4)
    try:
        fresh.load_state(tmp_path / "ckpt")
        restored = fresh.hf_state_dict()
        assert all(torch.equal(restored[k], saved[k]) for k in saved)  # fp32 values, not rounded to bf16
        assert torch.equal(fresh.logprobs(batch.input_ids, batch.attention_mask).logprobs, scores)
    finally:
        fresh.close()


def test_bf16_moe_policy_matches_fp32_and_keeps_a_frozen_router_frozen(model_factory):
    """Mixture-of-Experts in bf16 (Megatron's router computes in fp64 either way); measured gap 3.5e-3 max,
    gradient norm 3e-4 relative (nano Qwen3-MoE)."""
    from rlkit.policy.factory import in_process_policy

    path = model_factory("nano-moe", "qwen3-moe", seed=1)
    batch = random_batch(b=8, t=24)
    results = {}
    for precision in ("float32", "bfloat16"):
        policy = in_process_policy(PolicyConfig(model_name=str(path), precision=precision, train_micro_batch_size=4,
                                                optimizer=OptimizerConfig(lr=1e-3),
                                                megatron_cfg={"freeze_moe_router": True}))
        try:
            scores = policy.logprobs(batch.input_ids, batch.attention_mask).logprobs
            before = policy.hf_state_dict()
            step = policy.train_step(batch, pg_token_mean_loss)
            after = policy.hf_state_dict()
        finally:
            policy.close()
        routers = [k for k in before if k.endswith("mlp.gate.weight")]
        assert routers and all(torch.equal(before[k], after[k]) for k in routers)
        results[precision] = scores, step
    (fp32, fp32_step), (bf16, bf16_step) = results["float32"], results["bfloat16"]
    gap = (bf16 - fp32)[batch.attention_mask].abs()
    assert 1e-4 < gap.max() < 2e-2 and gap.mean() < 5e-3
    assert abs(bf16_step.grad_norm - fp32_step.grad_norm) < 2e-3 * fp32_step.grad_norm
