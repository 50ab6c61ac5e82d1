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
