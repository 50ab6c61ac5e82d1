"""A live dashboard for ``Session.run()``: plots, the latest samples and a stop control.

``session.dashboard()`` returns a :class:`Dashboard` registered in ``session.listeners``, so ``run()``
redraws it after every step. It plots reward (with dynamic sampling, over everything sampled, kept or dropped)
and held-out accuracy when evaluated, KL to the reference, entropy, clipped fraction, generation length, the
generator/trainer logprob mismatch and the seconds per stage; shows the latest samples; and has a button that
calls ``session.request_stop()``, so ``run()`` ends after the current step and no step is cut in half.

The stop button works while ``run()`` is executing where the frontend sends widget messages on a kernel
subshell, which the kernel handles on another thread (JupyterLab >= 4.4 with ipykernel >= 7, checked in a
browser by ``tests/tutorials/test_browser.py``; see ``_handle_clicks_where_the_frontend_sends_them`` for
the one routing detail this needs). Elsewhere a click is processed only after the cell finishes, and the
kernel's stop button (a KeyboardInterrupt, which the session survives) is the way to stop.

Without ipywidgets the dashboard degrades to text: a summary with sparklines that is updated in place
(``display(..., display_id=True)``) in a notebook, or printed once per step elsewhere.

In a notebook the dashboard also follows the cells (IPython's ``pre_run_cell`` / ``post_run_cell`` events): a
stop request reads "stop requested" only while a cell runs; once ``run()`` has returned, the header says at which
step it stopped and the button goes dark until a cell runs again. Panels that sit at 0 for a known reason say so
(no KL penalty: no reference pass; one update per rollout: the ratio is 1, nothing is clipped).

Deliberate simplifications: the charts are plain SVG strings (see :mod:`rlkit.notebook.charts`), redrawn
whole after each step; the dashboard reads ``session.history``, so steps taken by hand (``session.train``)
show after the next ``run()`` step or a call to :meth:`Dashboard.refresh`.
"""

from __future__ import annotations

import math
import os
from typing import Any

from rlkit.notebook.charts import line_chart, sparkline, stacked_bars
from rlkit.notebook.display import SAMPLE_COLUMNS, sample_rows
from rlkit.notebook.html import esc, table
from rlkit.notebook.ipython import ipython_shell

# (panel title, metric keys plotted in it)
PANELS: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("reward", ("rollout/reward_mean", "validation/accuracy")),
    ("KL to reference", ("train/kl",)),
    ("entropy", ("train/approx_entropy",)),
    ("clipped fraction", ("train/clipped_fraction",)),
    ("generation length", ("rollout/gen_length_mean", "rollout/gen_length_max")),
    ("generator/trainer mismatch", ("train/token_mult_prob_error",)),
)
REWARD, REWARD_ALL_SAMPLED = "rollout/reward_mean", "rollout/reward_mean_all_sampled"
HACKING = "warnings/reward_hacking"  # run() sets it at an evaluation that looks like reward hacking (rlkit.run.reward_hacking)
STAGES = ("rollout", "score", "logprobs", "reference_logprobs", "advantages", "train", "refit")  # step()'s order


def panels_for(history: list) -> tuple[tuple[str, tuple[str, ...]], ...]:
    """:data:`PANELS` for ``history``. With dynamic sampling (steps carrying ``rollout/reward_mean_all_sampled``)
    the reward panel plots the reward over everything sampled, kept groups and dropped ones: the kept groups'
    mean is chosen for its variance and stays near the middle whatever the policy learns
    (:mod:`rlkit.stages.dynamic_sampling`)."""
    if not any(REWARD_ALL_SAMPLED in m.values for m in history):
        return PANELS
    return tuple((title, tuple(REWARD_ALL_SAMPLED if k == REWARD else k for k in keys)) for title, keys in PANELS)


def _series(history: list, key: str) -> list[float]:
    return [float(m.values.get(key, math.nan)) for m in history]


def _labels(keys: tuple[str, ...]) -> list[str]:
    """Legend labels of one panel's series: the metric names, less a prefix they share up to an underscore
    (``gen_length_mean``, ``gen_length_max`` -> ``mean``, ``max``), so the latest values fit on the panel."""
    names = [k.split("/")[-1] for k in keys]
    shared = os.path.commonprefix(names) if len(names) > 1 else ""
    cut = shared.rfind("_") + 1
    return [n[cut:] for n in names] if cut else names


def step_seconds(m: Any) -> float:
    """Seconds the step took: ``timing/step_total`` when ``step()`` measured it, else the sum of the stage
    timings the step recorded (a step taken cell by cell has no total); NaN when there are none."""
    total = m.values.get("timing/step_total")
    if total is not None:
        return float(total)
    stages = [m.values[f"timing/{s}"] for s in STAGES if f"timing/{s}" in m.values]
    return float(sum(stages)) if stages else math.nan


def flat_panel_notes(run: Any) -> dict[str, str]:
    """Why a panel sits at 0, when the session's settings say so: KL is only measured with a reference pass
    (the loss asks for one when ``loss_fn.reference_policy_kl_penalty`` > 0 or KL is folded into the reward);
    with one optimizer update per rollout the importance ratio is exactly 1 (the trainer's logprobs are taken
    with the weights it then updates), so nothing is clipped."""
    notes = {}
    config = getattr(run, "config", None)
    if getattr(run, "needs_reference", None) is False:  # the run's rule (rlkit.run.run.needs_reference)
        notes["KL to reference"] = "KL penalty 0: not measured"
    if config is not None and config.updates_per_step == 1:
        notes["clipped fraction"] = "on-policy: ratio 1"
    return notes


class Dashboard:
    """Live plots of a session's run; see the module docstring. ``close()`` detaches it."""

    def __init__(self, run: Any, samples: int = 6):
        self.run = run  # what it reads: history, batch, stop_requested, listeners, request_stop(), config
        self.samples = samples
        self.widget = None  # the ipywidgets.VBox, or None in text mode
        self._handle = None  # display handle of the text view (text mode, in a notebook)
        self._parts: dict[str, Any] = {}
        self._cell_running: Any = None  # True/False while IPython reports cells; None: not known (no IPython)
        self._stopped_after: Any = None  # the step a stop request ended the last run() after (until a new run)
        self._events = _follow_cells(self)
        try:
            import ipywidgets
        except ImportError:
            ipywidgets = None
        if ipywidgets is not None:
            self._build(ipywidgets)
        run.listeners.append(self.update)
        self.refresh()

    # ---- what is shown --------------------------------------------------------------------------------
    @property
    def history(self) -> list:
        """The session's step metrics, oldest first (a copy: the plots read it while a run appends)."""
        return list(getattr(self.run, "history", []))

    def charts_html(self) -> str:
        """Every panel as inline SVG in a wrapping grid."""
        history = self.history
        xs = [m.step for m in history]
        panels = []
        notes = flat_panel_notes(self.run)
        for title, keys in panels_for(history):
            series = {label: _series(history, k) for label, k in zip(_labels(keys), keys)}
            series = {k: v for i, (k, v) in enumerate(series.items()) if i == 0 or any(not math.isnan(y) for y in v)}
            note = notes.get(title, "") if _all_zero(series) else ""
            panels.append(line_chart(title, xs, series, note=note))
        stages = {s: [0.0 if math.isnan(v) else v for v in _series(history, f"timing/{s}")] for s in STAGES}
        panels.append(stacked_bars("seconds per stage", xs, {k: v for k, v in stages.items() if any(v)}))
        return ("<div style='display:flex;flex-wrap:wrap;gap:4px'>"
                + "".join(f"<div>{p}</div>" for p in panels) + "</div>")

    def header_html(self) -> str:
        """The status line: latest step, policy version, reward, seconds per step, and a stop in progress."""
        history = self.history
        if not history:
            status = "no steps yet: run session.run(n) and this updates after every step"
        else:
            m = history[-1]
            reward = m.get(REWARD_ALL_SAMPLED, m.get(REWARD, math.nan))  # all sampled, with dynamic sampling
            status = f"step {m.step} · policy version {m.policy_version} · reward {reward:.3f}"
            if not math.isnan(step_seconds(m)):
                status += f" · {step_seconds(m):.2f} s/step"
        flagged = [m.step for m in history if m.values.get(HACKING)]
        if flagged:
            status += (f" · <b style='color:#b00'>likely reward hacking</b> at step {flagged[-1]}: held-out accuracy "
                       "fell while the reward rose (the warning says by how much)")
        if self._stopping():
            status += " · <b>stop requested</b>: run() ends after the current step"
        elif self._stopped_after is not None:
            status += f" · run() stopped after step {self._stopped_after}, as you asked"
        return f"<div style='font-family:monospace'><b>rlkit dashboard</b> · {status}</div>"

    def samples_html(self) -> str:
        """A table of the latest batch's first samples (prompt, completion, reward, advantage)."""
        batch = getattr(self.run, "batch", None)
        if batch is None:
            return ""
        return table(SAMPLE_COLUMNS, sample_rows(batch, self.samples), "latest samples")

    def text(self) -> str:
        """The text view: latest value and a sparkline per metric, plus seconds per stage."""
        history = self.history
        lines = [f"rlkit dashboard: {len(history)} step(s)" + (" (stop requested)" if self._stopping() else "")]
        flagged = [m.step for m in history if m.values.get(HACKING)]
        if flagged:
            lines.append(f"  LIKELY REWARD HACKING at step {flagged[-1]}: held-out accuracy fell while the reward rose")
        notes = flat_panel_notes(self.run)
        for title, keys in panels_for(history):
            values = _series(history, keys[0])
            last = next((v for v in reversed(values) if not math.isnan(v)), math.nan)
            note = f"  ({notes[title]})" if title in notes and _all_zero({title: values}) else ""
            lines.append(f"  {title:<28}{last:>10.4g}  {sparkline(values)}{note}")
        if history:
            times = [f"{s}={history[-1].values[f'timing/{s}']:.3f}s" for s in STAGES
                     if f"timing/{s}" in history[-1].values]
            lines.append("  seconds per stage: " + " ".join(times))
        return "\n".join(lines)

    def text_line(self) -> str:
        """One line for the latest step (what text mode prints outside a notebook)."""
        history = self.history
        if not history:
            return "rlkit dashboard: no steps yet"
        m = history[-1]
        shown = " ".join(f"{title.split()[0]}={m.values[keys[0]]:.4g}" for title, keys in panels_for(history)
                         if keys[0] in m.values)
        return f"step {m.step}: {shown}"

    # ---- updating ------------------------------------------------------------------------------------------
    def update(self, metrics: Any = None) -> None:
        """Called by ``run()`` after every step (``metrics`` is that step's StepMetrics)."""
        if metrics is not None:  # run() ends after this step if a stop is requested; else a run is going on
            self._stopped_after = metrics.step if getattr(self.run, "stop_requested", False) else None
        self.refresh()
        if self.widget is None and self._handle is None and getattr(ipython_shell(), "kernel", None) is None:
            print(self.text_line())

    def refresh(self) -> None:
        """Redraw from ``session.history`` and ``session.batch`` (also after steps taken by hand)."""
        if self.widget is not None:
            p = self._parts
            p["header"].value = self.header_html()
            p["charts"].value = self.charts_html()
            p["samples"].value = self.samples_html()
            self._paint_button()
        elif self._handle is not None:
            self._handle.update(_TextView(self.text()))

    def _paint_button(self) -> None:
        """Lit while a cell runs (or where cells are not known), greyed while a stop is pending, dark once the
        cell has ended (no ``run()`` to stop)."""
        button = self._parts.get("stop")
        if button is None:
            return
        stopping, idle = self._stopping(), self._cell_running is False
        if button.disabled != (stopping or idle):  # touch the button only on a change (a click may be setting it)
            button.disabled = stopping or idle
            button.description = ("Stopping after this step" if stopping else
                                  "Stop (no run() going)" if idle else "Stop after this step")
            button.button_style = "" if stopping or idle else "warning"

    def _stopping(self) -> bool:
        """A stop was requested and has not ended a run yet, which may still be executing (no cell is known
        to have ended since)."""
        return (bool(getattr(self.run, "stop_requested", False)) and self._stopped_after is None
                and self._cell_running is not False)

    def _cell_started(self, *info: Any) -> None:
        """IPython's ``pre_run_cell``: a cell (perhaps ``run()``) starts, so a click may have a run to stop: the
        button lights up."""
        self._cell_running = True
        self._paint_button()

    def _cell_finished(self, *result: Any) -> None:
        """IPython's ``post_run_cell``: ``run()`` has returned (or was never running), so a stop request is
        no longer pending: the header says where the run stopped, and the button goes dark (disabled, "no run()
        going") until a cell runs again."""
        self._cell_running = False
        if getattr(self.run, "stop_requested", False) and self._stopped_after is None and self.history:
            self._stopped_after = self.history[-1].step  # clicked after the last redraw of the run
        self.refresh()

    def _on_click(self, button: Any) -> None:
        # May run on a kernel subshell thread while run() executes on the main thread: set the flag, the
        # button's look and the header line (run() may end before the main thread redraws again).
        if self._cell_running is False:  # no cell executes, so no run() to stop (and the next one clears it)
            self._parts["header"].value = self.header_html().replace(
                "</div>", " · nothing is running: the button stops a running session.run()</div>")
            return
        self.run.request_stop()
        self._stopped_after = None
        button.disabled = True
        button.description = "Stopping after this step"
        self._parts["header"].value = self.header_html()

    def close(self) -> None:
        """Stop updating (removes the listener) and close the widget."""
        listeners = getattr(self.run, "listeners", [])
        if self.update in listeners:
            listeners.remove(self.update)
        if self._events is not None:
            self._events.unregister("pre_run_cell", self._cell_started)
            self._events.unregister("post_run_cell", self._cell_finished)
            self._events = None
        if self.widget is not None:
            self.widget.close()

    # ---- widget and display ---------------------------------------------------------------------------------
    def _build(self, w: Any) -> None:
        self._parts = {
            "header": w.HTML(),
            "charts": w.HTML(),
            "stop": w.Button(description="Stop after this step", icon="stop", button_style="warning",
                             tooltip="session.request_stop(): run() ends after the current step",
                             layout=w.Layout(width="220px")),
            "samples": w.HTML(),
        }
        for name, part in self._parts.items():
            part.add_class(f"rlkit-dashboard-{name}")
        self._parts["stop"].on_click(self._on_click)
        _handle_clicks_where_the_frontend_sends_them(self._parts["stop"])
        self.widget = w.VBox([self._parts["header"], self._parts["charts"], self._parts["stop"],
                              self._parts["samples"]])
        self.widget.add_class("rlkit-dashboard")

    def _ipython_display_(self) -> None:
        from IPython.display import display

        if self.widget is not None:
            display(self.widget)
        elif self._handle is None:
            self._handle = display(_TextView(self.text()), display_id=True)
        else:
            self._handle.display(_TextView(self.text()))

    __repr__ = text


def _all_zero(series: dict[str, list[float]]) -> bool:
    """Every measured value of the panel is 0 (and there is at least one)."""
    values = [v for ys in series.values() for v in ys if not math.isnan(v)]
    return bool(values) and all(v == 0 for v in values)


def _follow_cells(dashboard: Dashboard) -> Any:
    """Register the dashboard for IPython's cell events when it lives in an IPython shell; returns the shell's
    event manager (None elsewhere, where the dashboard cannot tell when ``run()`` returns)."""
    shell = ipython_shell()
    if shell is None:
        return None
    shell.events.register("pre_run_cell", dashboard._cell_started)
    shell.events.register("post_run_cell", dashboard._cell_finished)
    return shell.events


def _handle_clicks_where_the_frontend_sends_them(button: Any) -> None:
    """Let the stop button's clicks reach the kernel while a cell runs (a private ipykernel hook, isolated here).

    JupyterLab (>= 4.4) sends each widget's messages on a kernel subshell, which ipykernel (>= 7) handles on
    its own thread even while the main thread executes ``run()``. But ipykernel 7.4 then re-routes a comm's
    incoming messages to the shell that last *published* on that comm, which for a widget made in a notebook
    cell is the busy main shell: the click would wait until ``run()`` returns. So this replaces that routing,
    for this button's comm only, with "keep the frontend's choice" (the button only sets a flag, so nothing
    waits for a reply on the main shell). It overrides ``comm._reply_subshell_for``; with other kernels or
    versions the method is absent, nothing changes, and a click waits for the cell to end (the kernel's stop
    button still works: the session survives a KeyboardInterrupt).

    Why no public mechanism: neither ipywidgets nor ipykernel has an API to choose where a comm's messages
    are handled (the routing above is internal). The public alternatives fail: processing queued messages
    from the training loop needs ``kernel.do_one_iteration`` (private, and it would run queued cells too);
    running ``run()`` in a thread takes Ctrl-C and progress output away from the cell; an ``async`` run loop
    (ipykernel dispatches comm messages while an async cell awaits) changes how every notebook calls ``run``.
    ``tests/notebook/test_dashboard.py`` pins this dependency and ``tests/tutorials/test_browser.py`` checks
    the click in a real JupyterLab.
    """
    comm = getattr(button, "comm", None)
    if comm is not None and callable(getattr(comm, "_reply_subshell_for", None)):
        comm._reply_subshell_for = lambda data, default: default


class _TextView:
    """The text-mode display object (plain text; ``<pre>`` in HTML frontends)."""

    def __init__(self, text: str):
        self.text = text

    def __repr__(self) -> str:
        return self.text

    def _repr_html_(self) -> str:
        return f"<pre class='rlkit-dashboard-text'>{esc(self.text)}</pre>"
