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
from rlkit.run.metrics import StepMetrics
from tests.helpers import random_batch


class StandInSession:
    def __init__(self):
        self.history, self.listeners, self.batch, self.stop_requested = [], [], None, False

    needs_reference = property(lambda self: self.loss_fn.needs_reference)  # Session's rule, for an RLLoss

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


def test_panel_legends_drop_the_prefix_their_series_share():
    session = StandInSession()
    dash = Dashboard(session)
    session.finish_step(1)
    session.history[-1].values["validation/accuracy"] = 0.5
    charts = dash.charts_html()
    length = re.search(r"<svg[^>]*data-title='generation length'.*?</svg>", charts).group(0)
    assert ">mean 3</tspan>" in length and ">max 4</tspan>" in length
    reward = re.search(r"<svg[^>]*data-title='reward'.*?</svg>", charts).group(0)
    assert ">reward_mean 0.1</tspan>" in reward and ">accuracy 0.5</tspan>" in reward

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


TEXT_MODE_CELLS = [
    "import sys\nsys.modules['ipywidgets'] = None  # as if ipywidgets were not installed\n"
    "from types import SimpleNamespace\nfrom rlkit.notebook.dashboard import Dashboard\n"
    "from rlkit.run.metrics import StepMetrics\n"
    "session = SimpleNamespace(history=[], listeners=[], batch=None, stop_requested=False)\n"
    "dashboard = Dashboard(session)\ndashboard",
    "for step in range(1, 4):  # what run() does after each step\n"
    "    session.history.append(StepMetrics(step, step, {'rollout/reward_mean': step / 10}))\n"
    "    for listener in session.listeners:\n        listener(session.history[-1])",
]


def test_text_mode_updates_in_place_in_a_real_kernel(tmp_path):
    """In a notebook without ipywidgets the text view is one output, updated in place (display_id)."""
    from tests.tutorials.notebooks import run_cells

    nb = run_cells(TEXT_MODE_CELLS, tmp_path, timeout=120)
    first = [o for o in nb.cells[0].outputs if o.output_type != "stream"]  # (tqdm warns about ipywidgets)
    second = [o for o in nb.cells[1].outputs if o.output_type != "stream"]
    assert len(first) == 1 and first[0].output_type == "display_data" and second == []
    text = first[0].data["text/plain"]  # the output of the first cell, updated by the second
    assert text.startswith("rlkit dashboard: 3 step(s)") and "<pre" in first[0].data["text/html"]


def test_stop_clicks_keep_the_subshell_the_frontend_chose():
    """Pins the private ipykernel hook the stop button relies on (see ``_handle_clicks_where_the_frontend_sends_them``):
    if ipykernel renames or drops it, this fails and says where to look (the browser test would only time out)."""
    import inspect
    from types import SimpleNamespace

    from ipykernel.comm.comm import BaseComm
    from ipykernel.kernelbase import Kernel

    from rlkit.notebook.dashboard import _handle_clicks_where_the_frontend_sends_them

    assert "_reply_subshell_for" in inspect.getsource(Kernel.shell_channel_thread_main)  # where it is consulted
    comm = BaseComm(target_name="rlkit-test")  # outside a kernel: opening publishes nothing
    comm._reply_subshell_id = None  # what ipykernel records when a cell (the main shell) publishes on the comm
    assert comm._reply_subshell_for({"method": "custom"}, "subshell-1") is None  # a click would wait for the cell
    _handle_clicks_where_the_frontend_sends_them(SimpleNamespace(comm=comm))
    assert comm._reply_subshell_for({"method": "custom"}, "subshell-1") == "subshell-1"
    _handle_clicks_where_the_frontend_sends_them(SimpleNamespace(comm=object()))  # other kernels: nothing to do


def test_a_step_taken_cell_by_cell_shows_its_seconds_not_nan():
    session = StandInSession()
    dash = Dashboard(session)
    session.history.append(StepMetrics(1, 1, {"rollout/reward_mean": 0.0, "timing/rollout": 0.25, "timing/train": 0.5}))
    dash.refresh()  # train() by hand records no timing/step_total
    header = dash._parts["header"].value
    assert "0.75 s/step" in header and "nan" not in header
    session.finish_step(2)
    assert "0.20 s/step" in dash._parts["header"].value  # step()'s own total when there is one


def test_stop_banner_and_greyed_button_end_when_the_run_returns():
    session = StandInSession()
    dash = Dashboard(session)
    dash._cell_started()  # IPython: the cell with run() starts
    session.finish_step(1)
    dash._parts["stop"].click()
    assert "stop requested" in dash._parts["header"].value and dash._parts["stop"].disabled
    session.finish_step(2)  # the step the click let finish; run() returns after it
    assert "run() stopped after step 2, as you asked" in dash._parts["header"].value
    dash._cell_finished()  # IPython: the cell is done, so run() has returned
    header, button = dash._parts["header"].value, dash._parts["stop"]
    assert "stop requested" not in header and "run() stopped after step 2, as you asked" in header
    # dark once run() has returned (it stayed lit, as if a click could still stop something)
    assert button.disabled and button.description == "Stop (no run() going)" and button.button_style == ""
    dash._cell_started()  # another cell: the note stays until a new run() draws a step
    assert not button.disabled and button.description == "Stop after this step" and button.button_style == "warning"
    session.stop_requested = False  # what the next run() does when it starts
    session.finish_step(3)
    assert "stopped after" not in dash._parts["header"].value and "stop requested" not in dash._parts["header"].value


def test_a_click_after_the_last_redraw_still_ends_as_stopped_and_an_idle_click_stops_nothing():
    session = StandInSession()
    dash = Dashboard(session)
    dash._cell_started()
    session.finish_step(1)
    dash._parts["stop"].click()  # after the run's last redraw (e.g. while another listener runs)
    dash._cell_finished()
    assert "run() stopped after step 1, as you asked" in dash._parts["header"].value
    assert dash._parts["stop"].disabled  # dark: no run() going
    session.stop_requested = False  # the next run() starts without the request
    dash._parts["stop"].click()  # no cell runs: nothing to stop (a click that reached a dark button)
    assert not session.stop_requested and dash._parts["stop"].disabled
    assert "nothing is running" in dash._parts["header"].value


def panel(charts: str, title: str) -> str:
    return re.search(rf"<svg[^>]*data-title='{re.escape(title)}'.*?</svg>", charts).group(0)


def test_flat_kl_and_clipping_panels_say_why():
    from rlkit.algorithms import LossParams, RLLoss
    from rlkit.config.loading import load_config

    session = StandInSession()
    session.loss_fn, session.config = RLLoss(), load_config("quickstart")  # no KL penalty; 1 update per rollout
    dash = Dashboard(session)
    session.finish_step(1)
    session.history[-1].values["train/kl"] = 0.0
    charts = dash.charts_html()
    assert "KL penalty 0: not measured" in panel(charts, "KL to reference")
    assert "on-policy: ratio 1" in panel(charts, "clipped fraction")
    assert "(KL penalty 0: not measured)" in dash.text()

    session.loss_fn = RLLoss(LossParams(reference_policy_kl_penalty=0.01))
    session.config = load_config("quickstart", {"grpo.num_epochs": 2})
    charts = dash.charts_html()
    assert "rlkit-chart-note" not in panel(charts, "KL to reference")
    assert "rlkit-chart-note" not in panel(charts, "clipped fraction")


def test_seconds_per_stage_scale_is_the_tallest_bar_shown():
    session = StandInSession()
    dash = Dashboard(session)
    empty = panel(dash.charts_html(), "seconds per stage")
    assert "no data yet" in empty and "rlkit-chart-max" not in empty and "s</text>" not in empty
    for step in range(1, 4):
        session.finish_step(step)
    session.history[1].values["timing/train"] = 0.9  # step 2: 0.05 + 0.9 + 0.01 = 0.96 s
    bars = panel(dash.charts_html(), "seconds per stage")
    assert ">0.96s</text>" in bars and "tallest: step 2, 0.96 s" in bars
    line_y = float(re.search(r"class='rlkit-chart-max' x1='[^']*' y1='([^']*)'", bars).group(1))
    tops = [float(y) for y in re.findall(r"<rect x='[^']*' y='([^']*)'", bars)]
    assert min(tops) == line_y  # the dashed maximum line is the top of a drawn bar


STOP_NOTE_CELLS = [
    "from types import SimpleNamespace\nfrom rlkit.notebook.dashboard import Dashboard\n"
    "from rlkit.run.metrics import StepMetrics\n"
    "session = SimpleNamespace(history=[], listeners=[], batch=None, stop_requested=False)\n"
    "session.request_stop = lambda: setattr(session, 'stop_requested', True)\n"
    "dashboard = Dashboard(session)",
    "session.history.append(StepMetrics(1, 1, {'rollout/reward_mean': 0.5}))  # run() ends a step ...\n"
    "for listener in session.listeners:\n    listener(session.history[-1])\n"
    "dashboard._parts['stop'].click()  # ... the stop click lands after its redraw, and run() returns",
    "print(repr(dashboard._parts['header'].value), dashboard._parts['stop'].disabled)",
]


def test_in_a_real_kernel_the_end_of_the_cell_ends_the_stop_banner(tmp_path):
    """IPython's post_run_cell reaches the dashboard: after the cell, no "stop requested", the button is ready."""
    from tests.tutorials.notebooks import run_cells

    nb = run_cells(STOP_NOTE_CELLS, tmp_path, timeout=120)
    printed = "".join(o.get("text", "") for o in nb.cells[2].outputs if o.output_type == "stream")
    assert "run() stopped after step 1, as you asked" in printed and "stop requested" not in printed
    assert printed.strip().endswith("False")  # the button is enabled again


def test_with_dynamic_sampling_the_reward_panel_plots_everything_sampled():
    """The kept groups' mean (rollout/reward_mean) is chosen for its variance; the reward panel, the status line
    and the text views show the mean over every sample drawn when the steps carry it."""
    session = StandInSession()
    dash = Dashboard(session)
    session.finish_step(1)
    session.history[-1].values["rollout/reward_mean_all_sampled"] = 0.03
    dash.refresh()
    reward = re.search(r"<svg[^>]*data-title='reward'.*?</svg>", dash.charts_html()).group(0)
    assert ">reward_mean_all_sampled 0.03</tspan>" in reward and ">reward_mean 0.1<" not in reward
    assert "reward 0.030" in dash.header_html()
    assert "reward=0.03 " in dash.text_line() and re.search(r"reward\s+0.03 ", dash.text())
