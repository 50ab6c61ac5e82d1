"""Pure bf16 training (``policy.optimizer.main_params_dtype=bfloat16`` at ``policy.precision=bfloat16``), as a
model loaded in bf16 trains in TRL: bf16 weights, gradients and AdamW moments, no fp32 master anywhere.

Checked on both in-process backends against the fp32 policy on the same weights: every tensor the policy keeps
(its parameters, gradient buffers and optimizer state) is bf16 and together they are 8 bytes per parameter;
logprobs within bf16's bounds of fp32 (the same bounds as mixed precision, tests/policy/test_precision.py); one
AdamW step's loss and gradient norm within 2e-2 relative of fp32's and the weights moved; and updates below bf16's
resolution are lost, which the fp32 masters of mixed precision keep.
"""

import pytest
import torch

from rlkit.config.components import OptimizerConfig, PolicyConfig
from tests.helpers import pg_token_mean_loss, random_batch
from tests.policy.test_precision import BACKENDS, weights_around_steps


@pytest.fixture(scope="module")
def model_path(model_factory):
    return model_factory("nano", "qwen3", seed=1)


def make_policy(model_path, backend: str, precision: str, main_params_dtype: str, lr: float = 1e-3):
    cfg = PolicyConfig(model_name=str(model_path), precision=precision, train_micro_batch_size=4,
                       optimizer=OptimizerConfig(lr=lr, main_params_dtype=main_params_dtype),
                       megatron_cfg={"enabled": backend == "megatron"}, dtensor_cfg={"enabled": backend == "dtensor"})
    return BACKENDS[backend](cfg)


def kept_tensors(policy) -> list[torch.Tensor]:
    """Every tensor the policy keeps between steps: parameters, Megatron's gradient buffers (``main_grad``, the
    views into DDP's buffers), and the optimizer's state (Adam's step counters are 1-element tensors)."""
    params = list(policy.model.parameters())
    grads = [p.main_grad for p in params if getattr(p, "main_grad", None) is not None]
    state = [t for s in policy.optimizer.state.values() for t in s.values() if torch.is_tensor(t) and t.numel() > 1]
    local = [t.to_local() if hasattr(t, "to_local") else t for t in params + grads + state]
    return local


@pytest.mark.parametrize("backend", sorted(BACKENDS))
def test_pure_bf16_keeps_only_bf16_tensors_and_steps_like_fp32(model_path, backend):
    batch = random_batch(b=8, t=24)
    fp32 = make_policy(model_path, backend, "float32", "float32")
    try:
        fp32_scores = fp32.logprobs(batch.input_ids, batch.attention_mask).logprobs
        fp32_step = fp32.train_step(batch, pg_token_mean_loss)
    finally:
        fp32.close()
    pure = make_policy(model_path, backend, "bfloat16", "bfloat16")
    try:
        assert ", bfloat16, " in repr(pure)
        parameters = sum(p.numel() for p in pure.model.parameters())
        scores = pure.logprobs(batch.input_ids, batch.attention_mask).logprobs
        before = pure.hf_state_dict()
        step = pure.train_step(batch, pg_token_mean_loss)
        after = pure.hf_state_dict()
        kept = kept_tensors(pure)
    finally:
        pure.close()
    assert all(t.dtype == torch.bfloat16 for t in kept), sorted({str(t.dtype) for t in kept})
    # weights 2 + gradients 2 + two moments 2 x 2 bytes (Megatron keeps its gradient buffer; FSDP2 frees grads)
    assert sum(t.numel() * t.element_size() for t in kept) <= 8 * parameters
    valid = batch.attention_mask
    gap = (scores - fp32_scores)[valid].abs()
    assert 1e-4 < gap.max() < 2e-2 and gap.mean() < 5e-3, (gap.max(), gap.mean())
    assert abs(step.grad_norm - fp32_step.grad_norm) < 2e-2 * fp32_step.grad_norm
    assert abs(step.metrics["loss"] - fp32_step.metrics["loss"]) < 2e-2 * abs(fp32_step.metrics["loss"]) + 1e-3
    assert all(t.dtype == torch.bfloat16 for t in after.values())
    assert sum((after[k].float() - before[k].float()).abs().sum().item() for k in before) > 0


@pytest.mark.parametrize("backend", sorted(BACKENDS))
def test_pure_bf16_loses_the_updates_below_its_resolution_that_masters_keep(model_path, backend):
    """Five AdamW steps of lr 1e-5 (each weight moves 1e-5 per step): the norm weights sit at 1.0, where bf16's
    neighbours are 2^-7 apart, so pure bf16 leaves them exactly where they were, while mixed precision's fp32
    masters have moved them by ~5e-5."""
    moved = {}
    for dtype in ("bfloat16", "float32"):
        before, after = weights_around_steps(make_policy(model_path, backend, "bfloat16", dtype, lr=1e-5), steps=5)
        norms = [k for k in before if k.endswith("layernorm.weight")]
        moved[dtype] = max((after[k].float() - before[k].float()).abs().max().item() for k in norms)
    assert moved["bfloat16"] == 0.0 and 4e-5 < moved["float32"] <= 5e-5 * 1.01, moved


def test_pure_bf16_needs_bf16_compute():
    from pydantic import ValidationError

    from rlkit.config.loading import load_config

    with pytest.raises((ValidationError, ValueError)) as refused:
        load_config("quickstart", ["policy.optimizer.main_params_dtype=bfloat16"])
    assert "policy.precision=bfloat16" in str(refused.value)


@pytest.mark.parametrize("backend", sorted(BACKENDS))
def test_pure_bf16_checkpoint_resumes_exactly(model_path, backend, tmp_path):
    """Saved after one step and loaded into a fresh policy: the same bf16 weights and moments, so the next step
    gives the same weights bit for bit as the policy that never stopped."""
    first, second = random_batch(b=8, t=24), random_batch(b=8, t=24, seed=1)
    policy = make_policy(model_path, backend, "bfloat16", "bfloat16")
    try:
        policy.train_step(first, pg_token_mean_loss)
        policy.save_state(tmp_path / "ckpt")
        policy.train_step(second, pg_token_mean_loss)
        unbroken = policy.hf_state_dict()
    finally:
        policy.close()
    fresh = make_policy(model_path, backend, "bfloat16", "bfloat16")
    try:
        fresh.load_state(tmp_path / "ckpt")
        assert all(t.dtype == torch.bfloat16 for t in kept_tensors(fresh))
        fresh.train_step(second, pg_token_mean_loss)
        resumed = fresh.hf_state_dict()
    finally:
        fresh.close()
    assert all(torch.equal(resumed[k], unbroken[k]) for k in unbroken)
