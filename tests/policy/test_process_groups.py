"""Who creates the default process group destroys it, and a closed Megatron policy leaves no group alive.

The default group rlkit creates (a single-process gloo group) is shared by every in-process policy and by
vLLM's in-process engine; it is destroyed when its last holder releases it, and one that someone else created
is never destroyed by rlkit. Megatron-Core keeps two of its subgroups in globals that its own teardown does
not reset, and its rotary embedding's ``lru_cache`` keeps the model's context-parallel group: a closed policy
must drop both, or each session leaves a gloo group's threads and the rendezvous store's sockets behind.
"""

from __future__ import annotations

import datetime

import pytest
import torch.distributed as dist

from rlkit.config.components import PolicyConfig
from rlkit.policy.megatron import parallel
from rlkit.policy.megatron.policy import MegatronPolicy
from tests.helpers import random_batch
from tests.process_resources import process_counts


@pytest.fixture
def no_default_group():
    if dist.is_initialized():
        pytest.skip("an earlier test left a default process group in this process")
    yield
    if dist.is_initialized():  # a failed test must not leave it to the next one
        dist.destroy_process_group()


def test_the_last_holder_destroys_the_group_rlkit_created(no_default_group):
    parallel.acquire_process_group()
    group = dist.group.WORLD
    parallel.acquire_process_group()  # a second policy in the same process (Megatron next to DTensor)
    assert dist.group.WORLD is group
    parallel.release_process_group()
    assert dist.is_initialized() and dist.group.WORLD is group  # still held by the first
    parallel.release_process_group()
    assert not dist.is_initialized()
    parallel.release_process_group()  # one release too many changes nothing
    assert not dist.is_initialized()


def test_a_group_someone_else_created_is_left_alone(no_default_group, tmp_path):
    dist.init_process_group("gloo", init_method=f"file://{tmp_path / 'rendezvous'}", rank=0, world_size=1,
                            timeout=datetime.timedelta(seconds=60))
    group = dist.group.WORLD
    parallel.acquire_process_group()
    parallel.release_process_group()
    assert dist.is_initialized() and dist.group.WORLD is group


def test_a_closed_megatron_policy_leaves_no_process_group_threads(no_default_group, model_factory):
    from megatron.core import parallel_state

    before = process_counts()
    policy = MegatronPolicy(PolicyConfig(model_name=str(model_factory("nano", "llama")), train_micro_batch_size=8))
    batch = random_batch(b=4, t=16)
    policy.logprobs(batch.input_ids, batch.attention_mask)  # fills the rotary embedding's cache
    assert process_counts()["group_threads"] > before["group_threads"]
    policy.close()
    after = process_counts()
    assert not dist.is_initialized()
    assert not [name for name, value in vars(parallel_state).items() if isinstance(value, dist.ProcessGroup)]
    assert after["group_threads"] == before["group_threads"], (before, after)
    assert after["fds"] <= before["fds"], (before, after)


def test_a_single_process_group_on_a_gpu_machine_has_nccl_for_cuda_tensors(no_default_group, monkeypatch):
    """gloo alone refuses CUDA tensors (Megatron's DDP all-reduces its CUDA gradient buffers through the default
    group even at one rank: every train step failed on an H200, 2026-12-04), so with CUDA present the group
    rlkit creates pairs gloo (host tensors) with NCCL (CUDA tensors). NCCL cannot start without a GPU: the call
    is recorded, not made."""
    import torch

    from rlkit.policy import process_group

    calls = []
    monkeypatch.setattr(process_group, "_created_group", None)  # (put back as they were after the test)
    monkeypatch.setattr(process_group, "_holders", 0)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(process_group.dist, "init_process_group", lambda backend, **kw: calls.append((backend, kw)))
    monkeypatch.setattr(process_group.dist, "is_initialized", lambda: False)
    monkeypatch.delenv("RANK", raising=False)
    process_group.acquire_process_group()
    assert [(backend, kw["rank"], kw["world_size"]) for backend, kw in calls] == [("cpu:gloo,cuda:nccl", 0, 1)]
