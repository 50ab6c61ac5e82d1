"""The train stage's bookkeeping when a KeyboardInterrupt cuts a multi-step train() short.

A stand-in policy (it counts versions and can raise after or before its update) replaces the real one here,
because the test is about the stage around the policy: the policy's own all-or-nothing update under a real
SIGINT is tested with Megatron in ``tests/notebook/test_interrupts.py``.
"""

from __future__ import annotations

import pytest
import torch

from rlkit import stages
from rlkit.policy.base import TrainStepResult
from tests.helpers import random_batch


class StandInPolicy:
    def __init__(self, interrupt_at: int, after_update: bool):
        self.version, self.calls = 0, 0
        self.interrupt_at, self.after_update = interrupt_at, after_update

    def train_step(self, batch, loss_fn, *, return_logprobs=False) -> TrainStepResult:
        self.calls += 1
        if self.calls == self.interrupt_at and not self.after_update:
            raise KeyboardInterrupt  # during gradient accumulation: nothing applied
        self.version += 1
        if self.calls == self.interrupt_at:
            raise KeyboardInterrupt  # what a deferred Ctrl-C does: raised once the update is whole
        return TrainStepResult({"loss": float(self.calls)}, grad_norm=10.0 * self.calls, learning_rate=0.1,
                               num_microbatches=1, version=self.version)


def ready(b: int = 8):
    batch = random_batch(b=b)
    return batch.with_(prev_logprobs=torch.zeros_like(batch.generator_logprobs))


def test_an_interrupt_after_updates_says_how_many_were_applied():
    policy = StandInPolicy(interrupt_at=3, after_update=True)
    with pytest.raises(stages.TrainInterrupted) as caught:  # 4 minibatches of 2 rows: interrupted in the third
        stages.train(ready(), policy, None, stages.TrainSettings(global_batch_size=2))
    assert isinstance(caught.value, KeyboardInterrupt)
    assert caught.value.applied == 3 and policy.version == 3 and len(caught.value.steps) == 2
    assert caught.value.metrics() == {"loss": 1.5, "grad_norm": 15.0, "learning_rate": 0.1, "interrupted": 1.0}


def test_an_interrupt_before_any_update_is_a_plain_keyboard_interrupt():
    policy = StandInPolicy(interrupt_at=1, after_update=False)
    with pytest.raises(KeyboardInterrupt) as caught:
        stages.train(ready(), policy, None, stages.TrainSettings(global_batch_size=2))
    assert type(caught.value) is KeyboardInterrupt and policy.version == 0


def test_an_interrupt_in_a_later_minibatch_before_its_update_still_counts_the_earlier_ones():
    policy = StandInPolicy(interrupt_at=2, after_update=False)
    with pytest.raises(stages.TrainInterrupted) as caught:
        stages.train(ready(), policy, None, stages.TrainSettings(global_batch_size=2))
    assert caught.value.applied == 1 and len(caught.value.steps) == 1
    assert caught.value.metrics()["loss"] == 1.0
