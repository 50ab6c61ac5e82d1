"""The KL reference is resident only when used (:mod:`rlkit.policy.reference`), on every in-process backend.

What is counted: every tensor reachable from the policy object (its model's parameters and buffers, the bf16
copy, the optimizer state, the reference, anything else it holds), each storage once. With no reference the
policy holds the model's weights once; with one, twice. The reference's values are checked against the
policy's own logprobs before training (and, loaded back from the model folder after training, against them).
"""

import pytest
import torch
from torch import Tensor

from rlkit.config.components import OptimizerConfig, PolicyConfig
from rlkit.policy.backends import in_process_policy
from rlkit.policy.reference import ReferenceUnavailableError, swap_contents
from tests.helpers import pg_token_mean_loss, random_batch

BACKENDS = ["megatron", "dtensor", "hf"]


@pytest.fixture(scope="module")
def model_path(model_factory):
    return str(model_factory("nano", "qwen3", seed=5))


def make(model_path, backend, precision="float32"):
    cfg = PolicyConfig(model_name=model_path, precision=precision, train_micro_batch_size=4, logprob_batch_size=4,
                       optimizer=OptimizerConfig(lr=1e-3), megatron_cfg={"enabled": backend == "megatron"},
                       dtensor_cfg={"enabled": backend == "dtensor"}, hf_cfg={"enabled": backend == "hf"})
    return in_process_policy(cfg)


def policy_tensor_bytes(policy) -> int:
    """Bytes of every distinct tensor storage reachable from ``policy``'s attributes."""
    seen, total, stack, visited = set(), 0, [policy], set()
    while stack:
        obj = stack.pop()
        if id(obj) in visited:
            continue
        visited.add(id(obj))
        if isinstance(obj, Tensor):
            t = obj.to_local() if hasattr(obj, "to_local") else obj
            storage = t.untyped_storage()
            if storage.data_ptr() not in seen and storage.nbytes():
                seen.add(storage.data_ptr())
                total += storage.nbytes()
        elif isinstance(obj, torch.nn.Module):
            stack.extend(torch.nn.Module.parameters(obj))  # (Megatron's DDP has a `buffers` attribute of its own)
            stack.extend(torch.nn.Module.buffers(obj))
        elif isinstance(obj, torch.optim.Optimizer):
            stack.extend(v for state in obj.state.values() for v in state.values())
        elif isinstance(obj, dict):
            stack.extend(obj.values())
        elif isinstance(obj, (list, tuple, set)):
            stack.extend(obj)
        elif type(obj).__module__.startswith("rlkit.") and hasattr(obj, "__dict__"):
            stack.extend(vars(obj).values())
    return total


def param_bytes(policy) -> int:
    return sum((p.to_local() if hasattr(p, "to_local") else p).untyped_storage().nbytes()
               for p in policy.model.parameters())


@pytest.mark.parametrize("backend", BACKENDS)
def test_no_reference_weights_are_resident_without_a_kl_penalty(model_path, backend):
    policy = make(model_path, backend)
    try:
        weights = param_bytes(policy)
        policy.keep_reference(False)  # what the builder says for a loss with no KL penalty
        assert policy.reference_state is None
        batch = random_batch(b=4, t=16)
        policy.train_step(batch, pg_token_mean_loss)
        policy.set_reference_to_current()  # (an SFT warm start does this): still nothing copied
        buffers = sum(b.untyped_storage().nbytes() for b in policy.model.buffers())
        optimizer = sum(v.untyped_storage().nbytes() for s in policy.optimizer.state.values() for v in s.values()
                        if isinstance(v, Tensor) and v.dim())
        # the weights once, their optimizer state (2x) and nothing else of model size
        assert policy_tensor_bytes(policy) <= weights + buffers + optimizer + 4096, (policy_tensor_bytes(policy), weights)
        assert "not resident" in policy.reference_residency()
        policy.keep_reference(True)  # the reference is now the live weights (nothing changed since it was set)
        assert policy_tensor_bytes(policy) >= 2 * weights + optimizer
        assert "resident" in policy.reference_residency() and "not" not in policy.reference_residency()
    finally:
        policy.close()


@pytest.mark.parametrize("backend", BACKENDS)
def test_a_reference_asked_for_after_training_is_the_model_folder(model_path, backend):
    policy = make(model_path, backend)
    try:
        batch = random_batch(b=4, t=16)
        policy.keep_reference(False)
        before = policy.logprobs(batch.input_ids, batch.attention_mask).logprobs
        policy.train_step(batch, pg_token_mean_loss)
        after = policy.logprobs(batch.input_ids, batch.attention_mask).logprobs
        policy.keep_reference(True)  # configure() turned a KL penalty on: loaded from the folder, live weights kept
        assert torch.equal(policy.reference_logprobs(batch.input_ids, batch.attention_mask).logprobs, before)
        assert torch.equal(policy.logprobs(batch.input_ids, batch.attention_mask).logprobs, after)
    finally:
        policy.close()


def test_a_reference_frozen_while_unused_and_then_trained_past_is_refused(model_path):
    policy = make(model_path, "hf")
    try:
        batch = random_batch(b=4, t=16)
        policy.keep_reference(False)
        policy.set_reference_to_current()
        now = policy.logprobs(batch.input_ids, batch.attention_mask).logprobs
        policy.keep_reference(True)  # unchanged since frozen: the live weights are copied
        assert torch.equal(policy.reference_logprobs(batch.input_ids, batch.attention_mask).logprobs, now)
        policy.keep_reference(False)
        assert policy.reference_state is None  # rebuildable (weights unchanged): dropped
        policy.set_reference_to_current()
        policy.train_step(batch, pg_token_mean_loss)
        with pytest.raises(ReferenceUnavailableError, match="set_reference_to_current"):
            policy.reference_logprobs(batch.input_ids, batch.attention_mask)
    finally:
        policy.close()


@pytest.mark.parametrize("backend,precision", [("megatron", "float32"), ("megatron", "bfloat16"),
                                               ("dtensor", "float32"), ("hf", "float32")])
def test_the_reference_swap_clones_no_weights(model_path, backend, precision, monkeypatch):
    policy = make(model_path, backend, precision)
    try:
        batch = random_batch(b=4, t=16)
        policy.keep_reference(True)
        initial = {n: p.detach().clone() for n, p in policy.model.named_parameters()}
        policy.train_step(batch, pg_token_mean_loss)
        live = {n: p.detach().clone() for n, p in policy.model.named_parameters()}
        cloned = []
        original = torch.Tensor.clone
        monkeypatch.setattr(torch.Tensor, "clone", lambda t, *a, **k: cloned.append(t.numel()) or original(t, *a, **k))
        with policy.reference.weights_in():
            inside = {n: p.detach() for n, p in policy.model.named_parameters()}
            if precision == "float32":  # the reference is in the parameters themselves
                assert all(torch.equal(inside[n], initial[n]) for n in inside)
        monkeypatch.undo()
        assert not cloned, cloned
        assert all(torch.equal(p.detach(), live[n]) for n, p in policy.model.named_parameters())
    finally:
        policy.close()


def test_swap_contents_exchanges_in_chunks():
    a, b = torch.arange(10.0), -torch.arange(10.0)
    swap_contents(a, b, torch.empty(3))
    assert torch.equal(a, -torch.arange(10.0)) and torch.equal(b, torch.arange(10.0))
