"""The memory hand-off's owner (:class:`rlkit.weight_sync.Handoff`): one test per strategy, with recording stand-ins
for the engine and the policy (the test is about which side lets go of what, and when; the real engines' sides are
tested in tests/policy/test_optimizer_offload.py, tests/generation/test_vllm_release.py and
tests/session/test_release_weights.py)."""

from __future__ import annotations

import pytest

from rlkit.weight_sync import Handoff, before_engine_starts
from rlkit.weight_sync.handoff import engine_handoff


class Engine:
    def __init__(self, sleeps=False, releases=False):
        self.sleeps_between_rollouts, self.releases_weights_for_training = sleeps, releases
        self.weights_released, self.calls = False, []

    def release_weights(self) -> int:
        self.calls.append("release_weights")
        self.weights_released = True
        return 1


class Policy:
    def __init__(self, base_out=False):
        self.releases_base_while_generating, self.calls = base_out, []

    def offload_optimizer_state(self):
        self.calls.append("offload_optimizer_state")

    def release_gradient_buffers(self):
        self.calls.append("release_gradient_buffers")

    def release_frozen_base(self) -> int:
        self.calls.append("release_frozen_base")
        return 1


def test_a_sleeping_engine_gets_the_optimizer_state_at_each_refit():
    policy, engine = Policy(), Engine(sleeps=True)
    handoff = Handoff(policy, engine)
    assert handoff.engine == "sleep" and not handoff.engine_needs_refit()
    assert handoff.before_policy_pass() is False and engine.calls == []  # it sleeps by itself after generating
    handoff.before_refit()
    assert policy.calls == ["offload_optimizer_state"]


def test_an_engine_that_releases_its_weights_takes_turns_with_the_gradient_buffers():
    policy, engine = Policy(), Engine(releases=True)
    handoff = Handoff(policy, engine)
    assert handoff.engine == "release_weights"
    assert handoff.before_policy_pass() is True and engine.calls == ["release_weights"]  # logprobs: out
    assert handoff.before_policy_pass() is False and engine.calls == ["release_weights"]  # train: already out
    assert handoff.engine_needs_refit()  # a rollout now must refit first
    handoff.before_refit()
    assert policy.calls == ["release_gradient_buffers"]
    engine.weights_released = False  # (the refit's reload rebuilds them)
    assert not handoff.engine_needs_refit()


def test_an_engine_that_keeps_its_memory_moves_nothing():
    policy, engine = Policy(), Engine()
    handoff = Handoff(policy, engine)
    assert handoff.engine == "none" and engine_handoff(engine) == "none"
    assert handoff.before_policy_pass() is False and not handoff.engine_needs_refit()
    handoff.before_refit()
    before_engine_starts(policy)
    assert policy.calls == [] and engine.calls == []


@pytest.mark.parametrize("engine", [Engine(), Engine(sleeps=True), Engine(releases=True)])
def test_a_frozen_base_is_out_while_any_engine_generates(engine):
    policy = Policy(base_out=True)
    before_engine_starts(policy)
    assert policy.calls == ["release_frozen_base"]  # before the engine first loads
    policy.calls.clear()
    Handoff(policy, engine).before_refit()
    assert policy.calls[-1] == "release_frozen_base"  # before each refit's export, with the engine's own step
    assert len(policy.calls) == (1 if engine_handoff(engine) == "none" else 2)
