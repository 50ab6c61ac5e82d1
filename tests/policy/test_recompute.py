"""Activation recompute changes memory, not numbers: losses and gradients with and without it agree within 1e-6
(fp32), on each backend and each Megatron setting. That recompute really ran is checked by counting forward
calls of the recomputed module during backward (twice its calls without recompute), so a key that silently did
nothing fails here."""

import pytest
import torch

from rlkit.config.components import PolicyConfig
from rlkit.errors import ConfigError
from rlkit.config.loading import load_config
from rlkit.policy.backends import in_process_policy
from tests.helpers import pg_token_mean_loss, random_batch

TOL = 1e-6

MEGATRON = {
    "full-uniform": dict(recompute_granularity="full", recompute_method="uniform", recompute_num_layers=1),
    "full-block": dict(recompute_granularity="full", recompute_method="block", recompute_num_layers=2),
    "selective": dict(recompute_granularity="selective"),
}


@pytest.fixture(scope="module")
def model_path(model_factory):
    return str(model_factory("nano", "qwen3", seed=7))


def make(model_path, backend, recompute: dict, lora: bool = False):
    sections = {"megatron_cfg": {"enabled": backend == "megatron"}, "dtensor_cfg": {"enabled": backend == "dtensor"},
                "hf_cfg": {"enabled": backend == "hf"}}
    sections[f"{backend}_cfg"].update(recompute)
    return in_process_policy(PolicyConfig(model_name=model_path, train_micro_batch_size=4,
                                          lora_cfg={"enabled": lora, "dim": 4}, **sections))


def counted(policy, backend, selective):
    """Forward calls of each recomputed unit (Megatron: a layer, or its core attention; transformers: a layer)."""
    calls = [0]
    model = policy.model
    if backend == "megatron":
        units = [layer.self_attention.core_attention if selective else layer for layer in model.decoder.layers]
    else:
        units = list(model.model.layers)
    for unit in units:  # (the instance's forward: transformers' recompute runs no forward hooks)
        unit.forward = (lambda forward: lambda *a, **k: calls.__setitem__(0, calls[0] + 1) or forward(*a, **k))(unit.forward)
    return calls


def loss_and_grads(model_path, backend, recompute, lora=False):
    policy = make(model_path, backend, recompute, lora)
    try:
        calls = counted(policy, backend, recompute.get("recompute_granularity") == "selective")
        metrics = policy.compute_gradients(random_batch(b=8, t=24, seed=2), pg_token_mean_loss)
        grads = {n: (p.grad.full_tensor() if hasattr(p.grad, "full_tensor") else p.grad).clone()
                 for n, p in policy.model.named_parameters() if p.requires_grad}
        return metrics["loss"], grads, calls[0]
    finally:
        policy.close()


@pytest.mark.parametrize("backend,setting,lora", [("megatron", k, False) for k in MEGATRON] + [
    ("dtensor", "layers", False), ("hf", "layers", False),
    # adapters: nothing before them requires grad (the embedding is frozen), and a reentrant checkpoint's outputs
    # require grad only if an input does, so without care the loss would have no gradient at all
    ("megatron", "full-uniform", True), ("hf", "layers", True), ("dtensor", "layers", True)])
def test_recompute_gives_the_same_loss_and_gradients(model_path, backend, setting, lora):
    on = MEGATRON[setting] if backend == "megatron" else {"activation_checkpointing": True}
    loss0, grads0, calls0 = loss_and_grads(model_path, backend, {}, lora)
    loss1, grads1, calls1 = loss_and_grads(model_path, backend, on, lora)
    assert grads0 and any(g.abs().max() > 0 for g in grads0.values())  # (adapters: B's; A's are 0 while B is 0)
    assert calls1 == 2 * calls0, (calls0, calls1)  # every unit ran again in backward
    assert abs(loss1 - loss0) <= TOL * max(1.0, abs(loss0))
    worst = max((grads1[n] - grads0[n]).abs().max().item() for n in grads0)
    assert worst <= TOL, worst


@pytest.mark.parametrize("overrides,words", [
    (["policy.megatron_cfg.recompute_granularity=full"], "needs recompute_method"),
    (["policy.megatron_cfg.recompute_granularity=selective", "policy.megatron_cfg.recompute_num_layers=1"],
     "unset recompute_method"),
    (["policy.megatron_cfg.recompute_method=uniform"], "recompute_granularity is not"),
])
def test_incomplete_recompute_settings_are_refused_with_the_fix(overrides, words):
    with pytest.raises(ConfigError, match=words):
        load_config("quickstart", overrides)
