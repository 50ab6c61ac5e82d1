"""A KeyboardInterrupt (Jupyter's stop button sends SIGINT) in the middle of a stage leaves the session usable.

Real components throughout (Megatron policy, in-process vLLM). The interrupts are real SIGINTs sent to this
process at a chosen point: from the loss function (mid gradient accumulation), from an optimizer pre-step hook
(mid update, where the policy defers Ctrl-C), from inside vLLM's weight loading (mid refit, via a weights
iterator that the test double below hands to vLLM) and from a timer while vLLM is generating (mid rollout).
"""

from __future__ import annotations

import copy
import os
import signal
import threading
import time

import pytest
import torch

import rlkit
from rlkit.envs import RewardFunctionEnvironment

pytestmark = pytest.mark.timeout(300)  # a hang (e.g. an engine left with orphaned requests) fails, not blocks


def varied_reward(prompts, completions, answer, **columns):
    """Exact match plus a length bonus: an untrained model's rewards differ within a group, so steps move."""
    return [float(c.strip() == a) + 0.1 * len(c) for c, a in zip(completions, answer)]


def interrupt_now() -> None:
    """What Jupyter's stop button does: SIGINT to the kernel process (delivered to the main thread)."""
    os.kill(os.getpid(), signal.SIGINT)
    time.sleep(0.5)  # the KeyboardInterrupt is raised here at the latest (or deferred by the policy)


@pytest.fixture(scope="module")
def session(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("interrupts")
    s = rlkit.Session.from_config("quickstart", {
        "policy.model_name": str(tmp / "model"), "policy.model_preset": "nano",
        "policy.train_micro_batch_size": 4, "policy.logprob_batch_size": 16,  # 4 microbatches per step
        "policy.generation.refit_bucket_size_mb": 0.05,  # several buckets per refit
        "policy.optimizer.lr": 1e-3,
        "grpo.num_prompts_per_step": 4, "grpo.num_generations_per_prompt": 4, "grpo.use_dynamic_sampling": False,
        "sft.enabled": False, "data.num_train": 200, "data.num_validation": 16, "eval.num_prompts": 16,
    }, env=RewardFunctionEnvironment(varied_reward))
    s.step()  # the optimizer has moments, so "unchanged optimizer state" means something
    yield s
    s.close()


def ready_batch(s):
    return s.advantages(s.logprobs(s.score(s.rollout())))


def snapshot(policy) -> dict:
    return {
        "params": {n: p.detach().clone() for n, p in policy.model.named_parameters()},
        "optimizer": copy.deepcopy(policy.optimizer.state_dict()),
        "scheduler": copy.deepcopy(policy.scheduler.state_dict()),
        "version": policy.version,
    }


def restore(policy, snap: dict) -> None:
    with torch.no_grad():
        for n, p in policy.model.named_parameters():
            p.copy_(snap["params"][n])
    policy.optimizer.load_state_dict(copy.deepcopy(snap["optimizer"]))
    policy.scheduler.load_state_dict(copy.deepcopy(snap["scheduler"]))
    policy.version = snap["version"]


def assert_same_state(a: dict, b: dict) -> None:
    assert a["version"] == b["version"]
    for n in a["params"]:
        assert torch.equal(a["params"][n], b["params"][n]), f"weights differ: {n}"
    sa, sb = a["optimizer"]["state"], b["optimizer"]["state"]
    assert sa.keys() == sb.keys()
    for i in sa:
        for key in sa[i]:
            assert torch.equal(torch.as_tensor(sa[i][key]), torch.as_tensor(sb[i][key])), f"optimizer state {i}/{key}"
    assert a["optimizer"]["param_groups"] == b["optimizer"]["param_groups"]
    assert a["scheduler"] == b["scheduler"]


def test_interrupt_during_gradient_accumulation_changes_nothing(session):
    if session.stale:
        session.refit()
    batch = ready_batch(session)
    before, steps_before = snapshot(session.policy), session.step_count
    real_loss, calls = session.loss_fn, []

    def interrupted_loss(logprobs, micro, counts):  # the user presses stop during the second microbatch
        calls.append(micro.batch_size)
        if len(calls) == 2:
            interrupt_now()
        return real_loss(logprobs, micro, counts)

    session.loss_fn = interrupted_loss
    try:
        with pytest.raises(KeyboardInterrupt):
            session.train(batch)
    finally:
        session.loss_fn = real_loss
    assert len(calls) == 2 and batch.batch_size > 2 * calls[0]  # stopped midway through the microbatches
    assert_same_state(snapshot(session.policy), before)  # weights, Adam moments, scheduler, version
    assert all(p.grad is None for p in session.policy.model.parameters())  # partial gradients dropped
    assert session.step_count == steps_before and not session.stale and session.last_train is not None

    # The next call works, and gives exactly what an uninterrupted step from the same state gives.
    session.train(batch)
    after_retry = snapshot(session.policy)
    restore(session.policy, before)
    session.train(batch, allow_reuse=True)  # the same update again, as the reference
    assert_same_state(snapshot(session.policy), after_retry)
    assert session.stale
    session.refit()


def test_interrupt_during_the_optimizer_update_is_deferred_until_the_step_is_whole(session):
    if session.stale:
        session.refit()
    batch = ready_batch(session)
    before, steps_before, history_before = snapshot(session.policy), session.step_count, len(session.history)
    hook = session.policy.optimizer.register_step_pre_hook(lambda *args: interrupt_now())
    try:
        with pytest.raises(KeyboardInterrupt):  # raised after the update, not inside it
            session.train(batch)
    finally:
        hook.remove()
    interrupted = snapshot(session.policy)
    assert interrupted["version"] == before["version"] + 1
    assert session.stale  # the policy moved: the generator is marked stale, not silently out of date
    # The update took effect, so the step is recorded although train() did not return (its metrics are lost).
    assert session.step_count == steps_before + 1 and len(session.history) == history_before + 1
    recorded = session.history[-1]
    assert recorded.step == steps_before + 1 and recorded.policy_version == interrupted["version"]
    assert recorded["train/interrupted"] == 1.0 and recorded["rollout/reward_mean"] == float(batch.rewards.mean())

    restore(session.policy, before)  # reference: the same step without an interrupt
    session.train(batch, allow_reuse=True)
    assert_same_state(interrupted, snapshot(session.policy))  # the interrupted update was applied whole

    metrics = session.step()  # the next call works: it refits the stale generator first
    assert not session.stale and abs(metrics["train/token_mult_prob_error"] - 1) < 1e-3


class InterruptedWeightLoad:
    """Test double around the real vLLM generator: hands vLLM the refit's stream of weights and sends SIGINT
    halfway through it, so the KeyboardInterrupt lands inside vLLM's weight loading."""

    def __init__(self, real):
        self.real, self.calls, self.tensors, self.interrupted_at = real, 0, 0, None

    def update_weights(self, stream):
        self.calls += 1
        items = list(stream)
        self.tensors, self.interrupted_at = len(items), len(items) // 2

        def weights():
            for i, item in enumerate(items):
                if i == self.interrupted_at:
                    interrupt_now()
                yield item

        self.real.llm.collective_rpc("reload_weights",
                                     kwargs={"weights_iterator": weights(), "is_checkpoint_format": True})

    def __getattr__(self, name):
        return getattr(self.real, name)


def test_interrupt_during_refit_leaves_the_generator_marked_stale_and_the_next_refit_fixes_it(session):
    if session.stale:
        session.refit()
    session.train(ready_batch(session))  # the policy moves: the refit has something to carry
    version = session.policy.version
    real = session.generator
    session.generator = double = InterruptedWeightLoad(real)
    try:
        with pytest.raises(KeyboardInterrupt):
            session.refit()
    finally:
        session.generator = real
    assert double.calls == 1 and 0 < double.interrupted_at < double.tensors  # stopped midway through the stream
    assert session.stale and session.generator_version != version  # marked, not assumed fine

    report = session.refit()  # the next call works
    assert not session.stale and report.policy_version == version and report.num_tensors == double.tensors
    batch = session.logprobs(session.score(session.rollout()))
    assert batch.info["logprob_abs_diff_max"] < 1e-3  # the generator holds exactly the policy's weights


def test_interrupt_during_rollout_leaves_the_generator_usable(session):
    if session.stale:
        session.refit()
    many = list(session.dataset["train"]) * 2  # 400 prompts x 4 samples: long enough to interrupt midway
    t0 = time.perf_counter()
    reference = session.rollout(rows=many, seed=123)
    delay = (time.perf_counter() - t0) / 3
    real_generate, inside = session.generator.generate, []

    def generate_then_interrupt(*args, **kwargs):  # SIGINT a third of the way into vLLM's engine loop
        threading.Timer(delay, os.kill, (os.getpid(), signal.SIGINT)).start()
        try:
            return real_generate(*args, **kwargs)
        except KeyboardInterrupt:
            inside.append(True)
            raise

    session.generator.generate = generate_then_interrupt
    try:
        with pytest.raises(KeyboardInterrupt):
            session.rollout(rows=many, seed=123)
            time.sleep(2 * delay + 1)  # if generation won the race, the interrupt lands here (and inside stays empty)
    finally:
        del session.generator.generate
    assert inside, "the interrupt did not land inside generate(); the test did not test anything"
    again = session.rollout(rows=many, seed=123)  # the next call works (and does not hang)
    assert again.completions == reference.completions and len(again) == len(reference)
    batch = session.logprobs(session.score(again))
    assert batch.info["logprob_abs_diff_max"] < 1e-3


def test_dashboard_stop_button_ends_run_after_the_current_step(session):
    """The graceful stop: the button sets a flag that run() reads between steps, so no step is cut."""
    dash = session.dashboard()
    started = session.step_count

    def press_stop_during_second_step(metrics):  # stands in for the user's click while step 2 runs
        if metrics.step == started + 2:
            dash._parts["stop"].click()

    session.listeners.append(press_stop_during_second_step)
    try:
        done = session.run(5, progress=False)
    finally:
        session.listeners.remove(press_stop_during_second_step)
        dash.close()
    assert [m.step for m in done] == [started + 1, started + 2]
    assert not session.stale and session.policy.version == done[-1].policy_version  # the step completed whole
    charts = dash._parts["charts"].value
    assert f"data-points='{len(session.history)}'" in charts and "stop requested" in dash._parts["header"].value
    assert session.run(1, progress=False)[0].step == started + 3  # the next run starts normally
