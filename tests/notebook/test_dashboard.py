"""The dashboard as a listener: what it draws after each step, its stop control, and its text fallback.

These tests drive it with a stand-in session (``history``, ``listeners``, ``batch``, ``request_stop``: the four
things the dashboard touches), because they are about the dashboard; the stop button against a real
``Session.run`` is tested in ``test_interrupts.py`` and every tutorial runs it with a real session.
"""

from __future__ import annotations

import re
import sys

import torch

from rlkit.notebook.dashboard import PANELS, Dashboard
from rlkit.stages.metrics import StepMetrics
from tests.helpers import random_batch


class StandInSession:
    def __init__(self):
        self.history, self.listeners, self.batch, self.stop_requested = [], [], None, False

    def request_stop(self):
        self.stop_requested = True

    def finish_step(self, step: int) -> None:
        """What ``Session.run`` does after a step: record the metrics, call the listeners."""
        values = {"rollout/reward_mean": 0.1 * step, "train/kl": 0.01, "train/approx_entropy": 1.0 - 0.05 * step,
                  "train/clipped_fraction": 0.0, "rollout/gen_length_mean": 3.0, "rollout/gen_length_max": 4.0,
                  "train/token_mult_prob_error": 1.0, "timing/rollout": 0.05, "timing/train": 0.1,
                  "timing/refit": 0.01, "timing/step_total": 0.2}
        self.history.append(StepMetrics(step, step, values))
        b = random_batch(b=8, group_size=4, seed=step)
        self.batch = b.with_(rewards=torch.full((8,), 0.1 * step))
        for listener in self.listeners:
            listener(self.history[-1])


def points(html: str, title: str) -> int:
    return int(re.search(rf"data-title='{re.escape(title)}' data-points='(\d+)'", html).group(1))


def test_dashboard_redraws_after_every_step():
    session = StandInSession()
    dash = Dashboard(session)
    assert dash.widget is not None and session.listeners == [dash.update]
    assert "no steps yet" in dash._parts["header"].value
    for step in range(1, 4):
        session.finish_step(step)
        charts = dash._parts["charts"].value
        assert points(charts, "reward") == step and points(charts, "entropy") == step
        assert points(charts, "seconds per stage") == step
        assert f"step {step} · policy version {step}" in dash._parts["header"].value
    assert {title for title, _ in PANELS} <= set(re.findall(r"data-title='([^']*)'", charts))
    samples = dash._parts["samples"].value
    assert "latest samples" in samples and samples.count("<tr>") == 1 + 6 and ">0.3</td>" in samples
    assert "rlkit-dashboard" in dash.widget._dom_classes


def test_stop_button_requests_a_stop_and_is_reset_by_the_next_run():
    session = StandInSession()
    dash = Dashboard(session)
    session.finish_step(1)
    dash._parts["stop"].click()
    assert session.stop_requested and dash._parts["stop"].disabled
    assert "stop requested" in dash._parts["header"].value
    session.stop_requested = False  # what the next run() does when it starts
    session.finish_step(2)
    assert not dash._parts["stop"].disabled


def test_close_detaches_the_listener():
    session = StandInSession()
    dash = Dashboard(session)
    dash.close()
    assert session.listeners == []
    session.finish_step(1)  # no error, no update


def test_without_ipywidgets_it_degrades_to_text(monkeypatch, capsys):
    monkeypatch.setitem(sys.modules, "ipywidgets", None)  # `import ipywidgets` now raises ImportError
    session = StandInSession()
    dash = Dashboard(session)
    assert dash.widget is None
    for step in range(1, 4):
        session.finish_step(step)
    printed = capsys.readouterr().out.splitlines()
    assert printed[-1].startswith("step 3: reward=0.3") and len(printed) == 3  # one line per step (no notebook)
    text = repr(dash)
    assert text.splitlines()[0] == "rlkit dashboard: 3 step(s)"
    assert re.search(r"reward\s+0\.3\s+▁.█$", text, re.M)  # latest value and a sparkline
    assert "seconds per stage: rollout=0.050s" in text
