"""What ``Session.close()`` releases: every thread and file a trained session opened.

A notebook kernel builds many sessions. Each one that trained held a default gloo process group (its
rendezvous store has a server thread and sockets), Megatron's subgroups and vLLM's, each with two gloo
worker threads and a transport loop. Left alive, a kernel gained 4 threads and 13 file descriptors per
session (tests/reliability/test_soak.py runs ten).
"""

from __future__ import annotations

import math

import pytest

import rlkit
from tests.process_resources import process_counts
from tests.session.conftest import tiny_overrides

pytestmark = pytest.mark.timeout(600)


def train_and_close(tmp_path) -> dict[str, int]:
    """One create/step/close cycle of a tiny session; the counts after it."""
    session = rlkit.Session.from_config("quickstart", tiny_overrides(tmp_path))
    metrics = session.step()
    assert session.step_count == 1 and math.isfinite(metrics["train/loss"])
    session.close()
    return process_counts()


def test_two_sessions_leave_no_threads_or_files_behind(tmp_path):
    import torch.distributed as dist

    before = process_counts()
    first = train_and_close(tmp_path)
    assert not dist.is_initialized()  # the default group the session created is gone
    assert first["group_threads"] <= before["group_threads"], (before, first)
    second = train_and_close(tmp_path)
    print("counts before, after one and after two sessions:", before, first, second)
    assert second["group_threads"] <= before["group_threads"], (before, second)
    assert second["threads"] <= first["threads"], (first, second)
    assert second["python_threads"] <= first["python_threads"], (first, second)
    assert second["fds"] <= first["fds"], (first, second)


def every_public_call(session, checkpoint) -> dict[str, object]:
    """One call of each public stage and method that needs the engines (arguments valid on an open session)."""
    return {
        "rollout": lambda: session.rollout(), "score": lambda: session.score(),
        "advantages": lambda: session.advantages(), "logprobs": lambda: session.logprobs(),
        "loss": lambda: session.loss(), "train": lambda: session.train(), "refit": lambda: session.refit(),
        "step": lambda: session.step(), "run": lambda: session.run(1, progress=False),
        "evaluate": lambda: session.evaluate(), "sft": lambda: session.sft(1, progress=False),
        "reset": lambda: session.reset(), "configure": lambda: session.configure(["grpo.val_period=0"]),
        "restore_run_state": lambda: session.restore_run_state(session.run_state.state_dict()),
        "sampling": lambda: session.sampling(), "stale": lambda: session.stale,
        "dashboard": lambda: session.dashboard(), "save": lambda: session.save(checkpoint),
    }


def test_a_closed_session_refuses_every_stage_with_a_clear_error(tmp_path):
    from rlkit.errors import RLKitError, SessionClosedError

    session = rlkit.Session.from_config("quickstart", tiny_overrides(tmp_path))
    session.close()
    session.close()  # closing twice is harmless
    assert session.closed and "closed" in repr(session)
    for name, call in every_public_call(session, tmp_path / "checkpoint").items():
        with pytest.raises(SessionClosedError) as caught:
            call()
        message = str(caught.value)
        assert message.startswith(f"this session is closed: session.{name}()"), (name, message)
        assert "Session.from_config(" in message, message
        assert isinstance(caught.value, RLKitError) and isinstance(caught.value, RuntimeError)
    assert not (tmp_path / "checkpoint").exists()  # save() refused before writing anything
