"""A sweep's result shows its reward plot inline in a notebook, beside the comparison table: the PNG the sweep
saved, read back (the repr draws nothing)."""

import base64
import re
from pathlib import Path

from rlkit.sweep import SweepRun, _write_outputs


def result(folder: Path):
    runs = [SweepRun(f"lr{lr}_s{seed}", (("policy.optimizer.lr", lr),), seed, folder / f"r{lr}{seed}",
                     {"reward_last_10_steps": 0.25 + seed / 10, "accuracy_after_rl": 0.5}, (0.1, 0.2, 0.3 + seed / 10),
                     False) for lr in (3e-4, 3e-3) for seed in (0, 1)]
    return _write_outputs(folder, "sweep", {"policy.optimizer.lr": [3e-4, 3e-3]}, [0, 1], {}, runs)


def test_the_html_shows_the_saved_plot_beside_the_table(tmp_path):
    shown = result(tmp_path)
    html = shown._repr_html_()
    png = re.search(r"<img src='data:image/png;base64,([A-Za-z0-9+/=]+)'", html)
    assert png and base64.b64decode(png.group(1)) == (tmp_path / "reward_curves.png").read_bytes()
    assert html.index("<table") < html.index("<img")  # the table, then the plot, side by side (flex)
    assert "final_reward_mean" in html and "0.0003" in html and "0.3" in html and "4 runs" in html


def test_without_its_plot_file_the_html_says_so_and_draws_nothing(tmp_path, monkeypatch):
    shown = result(tmp_path)
    (tmp_path / "reward_curves.png").unlink()
    monkeypatch.setattr("rlkit.sweep.plot_reward_curves", lambda *a: (_ for _ in ()).throw(AssertionError("drew")))
    html = shown._repr_html_()
    assert "<img" not in html and "no reward plot at" in html and "final_reward_mean" in html
