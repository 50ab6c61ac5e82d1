import pytest
import torch

from rlkit.policy.megatron.cpu import CPURNGStatesTracker, apply_cpu_fallbacks


def test_tracker_forks_a_separate_stream_and_restores_the_outer_one():
    tracker = CPURNGStatesTracker()
    tracker.add("model-parallel-rng", 123)
    torch.manual_seed(0)
    outer_expected = torch.rand(3)
    torch.manual_seed(0)
    with tracker.fork():
        inside_first = torch.rand(3)
    with tracker.fork():
        inside_second = torch.rand(3)
    assert torch.equal(torch.rand(3), outer_expected)  # the outer stream did not move
    assert torch.equal(inside_first, torch.rand(3, generator=torch.Generator().manual_seed(123)))
    assert not torch.equal(inside_first, inside_second)  # the tracked stream advanced


def test_dropout_under_the_tracker_is_reproducible():
    tracker = CPURNGStatesTracker()
    tracker.add("model-parallel-rng", 7)
    x = torch.ones(1000)
    with tracker.fork():
        a = torch.nn.functional.dropout(x, 0.5)
    tracker.reset()
    tracker.add("model-parallel-rng", 7)
    with tracker.fork():
        b = torch.nn.functional.dropout(x, 0.5)
    assert torch.equal(a, b) and 300 < int((a == 0).sum()) < 700


def test_applied_only_without_cuda():
    assert apply_cpu_fallbacks() == (not torch.cuda.is_available())
    if not torch.cuda.is_available():
        assert torch.cuda.current_device() == "cpu"


@pytest.mark.parametrize("recompute,asked", [(False, True), (True, True), (True, False)])
def test_each_layer_hands_its_freed_pages_back_in_a_train_step_only(model_factory, monkeypatch, recompute, asked):
    """With ``policy.return_freed_host_memory``: once per layer after its backward, and after the first
    (autograd-free) forward of a recomputed layer; the logprob pass (eval) and a rollout trim per call, not per
    layer. Without it (the default: each trim's pages are faulted in again by the next layer), never per layer."""
    from rlkit import host_memory
    from rlkit.config.backends import MegatronConfig
    from rlkit.config.components import PolicyConfig
    from rlkit.policy.backends import in_process_policy
    from tests.helpers import pg_token_mean_loss, random_batch

    from rlkit.policy.megatron import policy as megatron_policy

    trims = []
    monkeypatch.setattr(host_memory, "release_freed_heap_pages", lambda: trims.append(1) or True)
    monkeypatch.setattr(megatron_policy, "release_freed_heap_pages", lambda: True)  # (the step's own: not counted)
    mc = MegatronConfig(recompute_granularity="full", recompute_method="uniform", recompute_num_layers=1) if recompute \
        else MegatronConfig()
    monkeypatch.setattr(host_memory, "return_freed_memory_to_os", lambda: None)  # (not this test process's malloc)
    policy = in_process_policy(PolicyConfig(model_name=str(model_factory("nano", "qwen3")), train_micro_batch_size=8,
                                            megatron_cfg=mc, return_freed_host_memory=asked))
    try:
        layers = policy.adapter.arch.num_layers
        batch = random_batch(b=8, t=16)
        policy.logprobs(batch.input_ids, batch.attention_mask)
        assert trims == []
        policy.train_step(batch, pg_token_mean_loss)
    finally:
        policy.close()
    assert len(trims) == (layers * (2 if recompute else 1) if asked else 0)
