"""The policy's optimizer state offloaded to host memory while a colocated engine generates
(:meth:`rlkit.policy.in_process.InProcessPolicy.offload_optimizer_state`, wired in :class:`rlkit.weight_sync.Handoff`).

On the CPU the offload does nothing by design (the weights live in host memory already), so the CPU tests make
the policy believe its weights sit on an accelerator (``residency.frees_memory`` returns True): the real code
path then runs on the CPU, moving every state tensor into new host tensors (out of the optimizer) and
resizing Megatron's gradient buffers to nothing, and back. What only a GPU can show, device memory freed by
the offload, is the CUDA test's (skipped here).

The reference for "unchanged" is the same two steps taken by a second policy that never offloads: weights,
optimizer state and the step's numbers must be equal within 0 (the offload moves the same values and back).
"""

from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file
from torch import Tensor

from rlkit.config.components import OptimizerConfig, PolicyConfig
from rlkit.policy.factory import in_process_policy
from rlkit.policy.in_process import InProcessPolicy
from rlkit.stages import refit
from rlkit.weight_sync import Handoff
from tests.helpers import pg_token_mean_loss, random_batch

ON_CUDA = torch.cuda.is_available()
B1, B2 = random_batch(b=8, t=24, seed=1), random_batch(b=8, t=24, seed=2)


@pytest.fixture(scope="module")
def cfg(model_factory):
    return PolicyConfig(model_name=str(model_factory("nano", "qwen2", seed=3)), train_micro_batch_size=4,
                        optimizer=OptimizerConfig(lr=1e-2))


def build(cfg: PolicyConfig, backend: str) -> InProcessPolicy:
    policy = in_process_policy(cfg.model_copy(update={"backend": backend}))
    if not ON_CUDA:
        policy.residency.frees_memory = lambda: True  # run the moves on the CPU (module docstring)
    return policy


def on_device_state(policy: InProcessPolicy) -> dict[tuple[int, str], Tensor]:
    """(parameter index, state name) -> a copy of each optimizer state tensor on the weights' device."""
    index = {p: i for i, p in enumerate(policy.optimizer.param_groups[0]["params"])}
    return {(index[p], k): (v.full_tensor() if hasattr(v, "full_tensor") else v).detach().clone()
            for p, state in policy.optimizer.state.items() for k, v in state.items()
            if isinstance(v, Tensor) and v.device.type == policy.device.type}


def gradient_buffer_sizes(policy: InProcessPolicy) -> list[int]:
    """Bytes of the storages under Megatron's DDP gradient buffers ([] on the DTensor backend, which has none)."""
    ddp = getattr(policy.adapter, "_forward_module", None)
    return [b.grad_data.untyped_storage().nbytes() for b in ddp.buffers] if ddp is not None else []


def checkpoint(folder: Path) -> dict[str, Tensor]:
    tensors: dict[str, Tensor] = {}
    for shard in sorted((folder / "shards").glob("*.safetensors")):
        tensors.update(load_file(shard))
    return tensors


def two_steps(cfg: PolicyConfig, backend: str, offload: bool, tmp_path: Path) -> tuple[dict, dict, tuple]:
    """B1, then (with ``offload``: offload, checked, a checkpoint saved while offloaded compared with one saved
    before it) B2. Returns the weights, the optimizer state and the B2 step's numbers."""
    policy = build(cfg, backend)
    try:
        policy.train_step(B1, pg_token_mean_loss)
        if offload:
            policy.save_state(tmp_path / "in_place")
            state = on_device_state(policy)
            buffers = gradient_buffer_sizes(policy)
            assert {k for _, k in state} >= {"exp_avg", "exp_avg_sq"} and all(n > 0 for n in buffers)
            policy.offload_optimizer_state()
            assert on_device_state(policy) == {}, "state left on the weights' device"
            assert all(n == 0 for n in gradient_buffer_sizes(policy)), "gradient buffers not freed"
            policy.save_state(tmp_path / "offloaded")
            assert policy.residency.offloaded is not None, "save_state must leave the state offloaded"
            saved, reference = checkpoint(tmp_path / "offloaded"), checkpoint(tmp_path / "in_place")
            assert saved.keys() == reference.keys() and any(k.endswith("/exp_avg_sq") for k in saved)
            assert all(torch.equal(saved[k], reference[k]) for k in saved)
            policy.restore_optimizer_state()
            assert all(torch.equal(v, state[k]) for k, v in on_device_state(policy).items())
            assert on_device_state(policy).keys() == state.keys() and gradient_buffer_sizes(policy) == buffers
            policy.offload_optimizer_state()  # train_step brings it back by itself
        result = policy.train_step(B2, pg_token_mean_loss)
        assert policy.residency.offloaded is None
        return (policy.hf_state_dict(), on_device_state(policy),
                (result.metrics, result.grad_norm, result.learning_rate, result.version))
    finally:
        policy.close()


@pytest.mark.parametrize("backend", ["megatron", "dtensor"])
def test_a_step_after_offload_and_restore_equals_one_without(cfg, backend, tmp_path):
    weights, state, numbers = two_steps(cfg, backend, offload=True, tmp_path=tmp_path)
    weights_0, state_0, numbers_0 = two_steps(cfg, backend, offload=False, tmp_path=tmp_path)
    assert numbers == numbers_0
    assert weights.keys() == weights_0.keys() and all(torch.equal(weights[k], weights_0[k]) for k in weights)
    assert state.keys() == state_0.keys() and all(torch.equal(state[k], state_0[k]) for k in state)


def test_reset_and_load_while_offloaded(cfg, tmp_path):
    """A reset drops the offloaded state (the next step starts Adam over, its gradient buffers back); a load
    brings the checkpoint's state in and leaves it offloaded, as it found it."""
    policy = build(cfg, "megatron")
    try:
        policy.train_step(B1, pg_token_mean_loss)
        policy.save_state(tmp_path / "after_b1")
        saved = on_device_state(policy)
        policy.offload_optimizer_state()
        policy.load_state(tmp_path / "after_b1")
        assert policy.residency.offloaded is not None and on_device_state(policy) == {}
        policy.restore_optimizer_state()
        assert all(torch.equal(v, saved[k]) for k, v in on_device_state(policy).items())
        policy.offload_optimizer_state()
        policy.reset_optimizer(cfg.optimizer, cfg.scheduler)
        policy.train_step(B2, pg_token_mean_loss)
        assert all(n > 0 for n in gradient_buffer_sizes(policy))
        steps = {float(s["step"]) for s in policy.optimizer.state.values()}
        assert steps == {1.0}, f"a reset optimizer's first step, got steps {steps}"
    finally:
        policy.close()


def test_a_checkpoint_leaves_released_gradient_buffers_released(cfg, tmp_path):
    """On the CPU a refit next to an engine that releases its weights frees the gradient buffers alone (the
    state has nowhere to go: ``release_gradient_buffers``); a save or load in between brings them back for its
    call and frees them again, and the next step equals one that never released them."""
    policies = [in_process_policy(cfg) for _ in range(2)]  # (the CPU's own path: no offload forced)
    try:
        for policy in policies:
            policy.train_step(B1, pg_token_mean_loss)
        released = policies[0]
        released.release_gradient_buffers()
        assert all(n == 0 for n in gradient_buffer_sizes(released))
        released.save_state(tmp_path / "saved")
        assert all(n == 0 for n in gradient_buffer_sizes(released)), "the save left the gradient buffers allocated"
        released.load_state(tmp_path / "saved")
        assert all(n == 0 for n in gradient_buffer_sizes(released)), "the load left the gradient buffers allocated"
        steps = [policy.train_step(B2, pg_token_mean_loss) for policy in policies]
        assert all(n > 0 for n in gradient_buffer_sizes(released))
        assert steps[0].metrics == steps[1].metrics and steps[0].grad_norm == steps[1].grad_norm
    finally:
        for policy in policies:
            policy.close()


class SleepingEngine:
    """Stands in for vLLM colocated on a GPU (sleeps between rollouts), in a test of the order of the hand-off
    only: records when it wakes, loads, generates and sleeps, and whether the policy's state was offloaded."""

    sleeps_between_rollouts = True
    releases_weights_for_training = weights_released = False

    def __init__(self, policy: InProcessPolicy, log: list[str]):
        self.policy, self.log = policy, log

    def _offloaded(self) -> str:
        return "offloaded" if self.policy.residency.offloaded is not None else "IN PLACE"

    def update_weights(self, weights) -> None:
        list(weights)
        self.log.append(f"wake+load ({self._offloaded()})")

    def generate(self) -> None:
        self.log.append(f"generate+sleep ({self._offloaded()})")

    def reset_prefix_cache(self) -> None:
        pass


def test_hand_off_order_through_a_sleeping_engine(cfg):
    """What Session.step() does, twice: refit (offload, then the engine wakes), rollout, logprobs, train (the
    state back before the optimizer steps). An engine that stays awake gets no offload."""
    policy = build(cfg, "megatron")
    log: list[str] = []
    engine = SleepingEngine(policy, log)
    offload, restore = policy.offload_optimizer_state, policy.restore_optimizer_state

    def spy(name, method):
        def call(*args, **kwargs):
            log.append(name)
            return method(*args, **kwargs)
        return call

    def before_optimizer_step(optimizer, args, kwargs):
        log.append(f"optimizer.step ({engine._offloaded()}, {len(on_device_state(policy))} state tensors)")

    policy.offload_optimizer_state, policy.restore_optimizer_state = spy("offload", offload), spy("restore", restore)
    policy.optimizer.register_step_pre_hook(before_optimizer_step)
    try:
        for _ in range(2):
            Handoff(policy, engine).before_refit()
            refit(policy, engine)
            engine.generate()
            policy.logprobs(B1.input_ids, B1.attention_mask)
            policy.train_step(B1, pg_token_mean_loss)
        n = len(on_device_state(policy))
        assert n >= 2 * len(list(policy.model.parameters()))
        assert log == ["offload", "wake+load (offloaded)", "generate+sleep (offloaded)", "restore",
                       "optimizer.step (IN PLACE, 0 state tensors)",  # AdamW makes its state at its first step
                       "offload", "wake+load (offloaded)", "generate+sleep (offloaded)", "restore",
                       f"optimizer.step (IN PLACE, {n} state tensors)"]
        log.clear()
        SleepingEngine.sleeps_between_rollouts = False
        Handoff(policy, engine).before_refit()
        refit(policy, engine)
        assert log == ["wake+load (IN PLACE)"]
    finally:
        SleepingEngine.sleeps_between_rollouts = True
        policy.close()


def test_the_ray_group_forwards_offload_and_restore_to_every_rank():
    """RayPolicyGroup's side only (a recording ``_call_all`` stands in for the actors, which run the in-process
    methods tested above): both calls go to every rank under the in-process method's name."""
    from rlkit.policy.workers import RayPolicyGroup

    calls = []
    group = object.__new__(RayPolicyGroup)
    group._call_all = lambda method, *args, **kwargs: calls.append((method, args, kwargs))
    group.offload_optimizer_state()
    group.restore_optimizer_state()
    assert calls == [("offload_optimizer_state", (), {}), ("restore_optimizer_state", (), {})]
    assert all(callable(getattr(InProcessPolicy, method)) for method, _, _ in calls)


@pytest.mark.skipif(not ON_CUDA, reason="device memory freed by the offload needs CUDA; on this CPU the offload does "
                    "nothing (the weights live in host memory) and the moves are tested above on host tensors")
@pytest.mark.parametrize("backend", ["megatron", "dtensor"])
def test_offload_frees_gpu_memory_and_the_step_is_unchanged(cfg, backend, tmp_path):
    policy = build(cfg, backend)
    try:
        policy.train_step(B1, pg_token_mean_loss)
        state_bytes = sum(v.numel() * v.element_size() for v in on_device_state(policy).values())
        buffer_bytes = sum(gradient_buffer_sizes(policy))
        torch.cuda.synchronize()
        before = torch.cuda.memory_allocated()
        policy.offload_optimizer_state()
        freed = before - torch.cuda.memory_allocated()
        assert freed >= state_bytes + buffer_bytes, (freed, state_bytes, buffer_bytes)
        assert all(v.is_pinned() for copies in policy.residency.offloaded.values() for v, _ in copies.values())
    finally:
        policy.close()
    test_a_step_after_offload_and_restore_equals_one_without(cfg, backend, tmp_path)
