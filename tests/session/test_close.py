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
