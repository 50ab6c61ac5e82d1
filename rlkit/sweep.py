"""Ablation sweeps: a grid of config overrides x seeds, grouped in wandb, compared in a table and a plot.

    result = run_sweep("quickstart", parse_grid(["loss_fn.ratio_clip_max=0.2,0.28", "seed=0,1,2"]))
    result.table          # one row per grid point: final reward and held-out accuracy, mean and std over seeds

Crossed and paired values. Each entry ``key=v1,v2`` crosses with every other; entries tagged with one group name,
``key@group=v1,v2``, vary together instead (their i-th values make the i-th point of the group, so they need as
many values each) and the group crosses with the rest. A loss with its own clip range and aggregation, 2 points
x 3 seeds:

    rlkit sweep quickstart loss_fn.policy_loss@loss=ppo_clip,gspo loss_fn.ratio_clip_min@loss=0.2,3e-4 \
        loss_fn.ratio_clip_max@loss=0.2,4e-4 loss_fn.aggregation@loss=token_mean,seq_mean_token_mean seed=0,1,2

In Python a group is a tuple of keys mapped to tuples of values (``parse_grid`` returns the same form):

    run_sweep("quickstart", {("loss_fn.policy_loss", "loss_fn.ratio_clip_max"): [("ppo_clip", 0.2), ("gspo", 4e-4)],
                             "seed": [0, 1, 2]}, env=my_reward)

``env`` (an environment, or a reward function with TRL's signature) scores every run; a reward function named in
the config (``env.reward_fn: module:function``, e.g. ``--set env.reward_fn=my_rewards:reverse``) does too.

Why one process and one session: starting vLLM and Megatron costs far more than a short ablation run.
When no key that differs between two consecutive runs needs a new session (the table
:data:`rlkit.config.changes.CHANGES` says which do: the model, the generator, the data, the environment),
the session is reset to the state a fresh one would have (``Session.reset``: weights from the model folder,
new optimizer and schedule, fresh run state, step 0, RNGs seeded as at construction) instead of rebuilt;
any other change builds a new session. The test suite checks that a reset session reproduces a fresh
session's metrics exactly.

Written to the sweep folder: one run folder per run (metrics, summary, wandb offline run), ``runs.csv``,
``comparison.csv`` / ``comparison.md`` (per grid point: mean and std over seeds), ``reward_curves.png``
(reward per step, mean +- std over seeds) and ``sweep.json``.

Deliberate simplifications: runs are sequential (no scheduler, no parallel workers); a failing run stops
the sweep (the runs before it keep their folders).
"""

from __future__ import annotations

import base64
import csv
import itertools
import json
import math
import re
import statistics
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Mapping, Optional, Sequence

from rlkit.config.changes import Change, changes_needed
from rlkit.config.loading import load_config, parse_overrides, parse_value
from rlkit.config.run import RunConfig
from rlkit.envs import Environment, RewardFunctionEnvironment
from rlkit.errors import ConfigError
from rlkit.experiment import run_experiment
from rlkit.session import Session


# ---- grid ---------------------------------------------------------------------------------------------------
def _split_values(text: str) -> list[str]:
    """Split on commas outside brackets and quotes: ``0.2,[1,2],'a,b'`` -> ``["0.2", "[1,2]", "'a,b'"]``."""
    parts, depth, quote, current = [], 0, None, ""
    for ch in text:
        if quote:
            quote = None if ch == quote else quote
        elif ch in "'\"":
            quote = ch
        elif ch in "[{(":
            depth += 1
        elif ch in "]})":
            depth -= 1
        elif ch == "," and depth == 0:
            parts.append(current)
            current = ""
            continue
        current += ch
    parts.append(current)
    return [p.strip() for p in parts]


Grid = Mapping[Any, Sequence[Any]]  # key -> values (crossed), or a tuple of keys -> tuples of values (paired)


def parse_grid(items: Sequence[str]) -> dict[Any, list[Any]]:
    """``["loss_fn.ratio_clip_max=0.2,0.28", "seed=0,1,2"]`` -> ``{"loss_fn.ratio_clip_max": [0.2, 0.28],
    "seed": [0, 1, 2]}``; each value is parsed as an override's (YAML: numbers, booleans, lists in brackets).
    Entries tagged ``key@group=...`` with one group name become one paired entry, ``{(key1, key2): [(a1, a2),
    (b1, b2)]}`` (see the module docstring); their value counts must agree."""
    grid: dict[Any, list[Any]] = {}
    groups: dict[str, dict[str, list[Any]]] = {}
    problems, seen, order = [], set(), []  # order: a grid key or "@group", as first given
    for item in items:
        target, sep, values = item.partition("=")
        key, tagged, group = (part.strip() for part in target.partition("@"))
        if not sep or not key or not values.strip() or (tagged and not group):
            problems.append(f"grid entry {item!r} is not of the form key=v1,v2 or key@group=v1,v2 (e.g. "
                            "loss_fn.ratio_clip_max=0.2,0.28)")
        elif key in seen:
            problems.append(f"{key}: given twice in the grid; list all its values in one entry")
        else:
            seen.add(key)
            parsed = [parse_value(v, f"grid entry {item!r}: the value {v!r}") for v in _split_values(values)]
            (groups.setdefault(group, {}) if tagged else grid)[key] = parsed
            order += [f"@{group}" if tagged else key]
    for group, entries in groups.items():
        counts = {key: len(values) for key, values in entries.items()}
        if len(set(counts.values())) > 1:
            problems.append(f"grid group @{group}: its entries vary together and need as many values each, but "
                            + ", ".join(f"{key} has {n}" for key, n in counts.items()))
        elif "seed" in entries:
            problems.append(f"grid group @{group}: seed cannot be paired (every grid point runs every seed)")
        else:
            grid[f"@{group}"] = list(zip(*entries.values()))
    if problems:
        raise ConfigError(problems)
    return {(tuple(groups[k[1:]]) if k.startswith("@") else k): grid[k] for k in dict.fromkeys(order)}


def _axes(grid: Grid) -> tuple[list[tuple[str, ...]], list[list[tuple]]]:
    """The grid as crossed axes: each a tuple of keys (one key, or a paired group) and its points, each a tuple of
    values; ConfigError for a paired entry whose values do not match its keys."""
    keys, points, problems = [], [], []
    for key, values in grid.items():
        paired = isinstance(key, tuple)
        group = key if paired else (key,)
        vals = [tuple(v) if isinstance(v, (tuple, list)) else v for v in values] if paired else [(v,) for v in values]
        bad = [v for v in vals if not isinstance(v, tuple) or len(v) != len(group)]
        if bad:
            problems.append(f"grid group {group}: each value must be a tuple of {len(group)} values, one per key; "
                            f"got {bad[0]!r}")
        keys.append(group)
        points.append(vals)
    if problems:
        raise ConfigError(problems)
    return keys, points


def run_name(base: str, point: Sequence[tuple[str, Any]], seed: int) -> str:
    """A sweep run's name: the config's, the grid point's settings, the seed (``quickstart-clip=0.28-seed1``); a
    grid of seeds alone has no settings to name (``quickstart-seed1``)."""
    return "-".join(part for part in (base, _label(point), f"seed{seed}") if part)


def _label(point: Sequence[tuple[str, Any]]) -> str:
    text = "_".join(f"{key.rsplit('.', 1)[-1]}={value}" for key, value in point)
    return re.sub(r"[^A-Za-z0-9_.=+-]", "", text.replace(" ", ""))


# ---- results ------------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class SweepRun:
    name: str
    point: tuple[tuple[str, Any], ...]  # the grid values of this run (seed excluded)
    seed: int
    run_dir: Path
    summary: dict[str, Any]
    rewards: tuple[float, ...]  # rollout/reward_mean per RL step
    reused_session: bool  # True when a reset session ran it instead of a new one


@dataclass
class SweepResult:
    folder: Path
    group: str  # the wandb group of every run
    runs: list[SweepRun]
    table: list[dict[str, Any]]  # one row per grid point (see comparison.md)
    files: dict[str, Path] = field(default_factory=dict)

    def __repr__(self) -> str:
        return f"SweepResult({len(self.runs)} runs in {self.folder}, group {self.group!r})\n" + _markdown(self.table)

    def _repr_markdown_(self) -> str:
        return _markdown(self.table)

    def _repr_html_(self) -> str:
        """The comparison table beside the reward plot the sweep saved (``files["plot"]``, read back, not redrawn)."""
        from rlkit.notebook.html import esc, table

        columns = list(self.table[0]) if self.table else []
        rows = table(columns, ([row[c] for c in columns] for row in self.table),
                     f"{len(self.runs)} runs, group {self.group!r}: per grid point, mean and std over seeds")
        plot = self.files.get("plot")
        if plot is not None and Path(plot).is_file():
            data = base64.b64encode(Path(plot).read_bytes()).decode("ascii")
            figure = f"<img src='data:image/png;base64,{data}' alt='{esc(plot)}' style='max-width:100%'>"
        else:
            figure = f"<i>(no reward plot{' at ' + esc(plot) if plot else ''})</i>"
        return ("<div style='display:flex;flex-wrap:wrap;gap:12px;align-items:flex-start'>"
                f"<div style='max-width:100%;overflow-x:auto'>{rows}</div><div>{figure}</div></div>")


def _mean_std(values: Sequence[Optional[float]]) -> tuple[Optional[float], Optional[float]]:
    vals = [v for v in values if v is not None and math.isfinite(v)]
    if not vals:
        return None, None
    return statistics.fmean(vals), statistics.stdev(vals) if len(vals) > 1 else 0.0


def _by_point(runs: Sequence[SweepRun]) -> dict[tuple, list[SweepRun]]:
    """The runs of each grid point (its seeds), in the order the points first ran."""
    points: dict[tuple, list[SweepRun]] = {}
    for run in runs:
        points.setdefault(run.point, []).append(run)
    return points


def comparison_table(runs: Sequence[SweepRun]) -> list[dict[str, Any]]:
    """Per grid point: seeds, final reward (mean of the last <= 10 steps) and held-out accuracy after RL,
    each as mean and sample std over seeds."""
    table = []
    for point, group in _by_point(runs).items():
        reward = _mean_std([r.summary.get("reward_last_10_steps") for r in group])
        accuracy = _mean_std([r.summary.get("accuracy_after_rl") for r in group])
        gain = _mean_std([r.summary.get("accuracy_gain_points") for r in group])
        table.append({**dict(point), "seeds": len(group),
                      "final_reward_mean": reward[0], "final_reward_std": reward[1],
                      "accuracy_mean": accuracy[0], "accuracy_std": accuracy[1],
                      "accuracy_gain_points_mean": gain[0]})
    return table


def _fmt(value: Any) -> str:
    return f"{value:.4g}" if isinstance(value, float) else "" if value is None else str(value)


def _markdown(table: Sequence[Mapping[str, Any]]) -> str:
    if not table:
        return "(no runs)"
    columns = list(table[0])
    lines = ["| " + " | ".join(columns) + " |", "|" + "---|" * len(columns)]
    lines += ["| " + " | ".join(_fmt(row[c]) for c in columns) + " |" for row in table]
    return "\n".join(lines) + "\n"


def _write_csv(path: Path, rows: Sequence[Mapping[str, Any]]) -> Path:
    columns = list(dict.fromkeys(c for row in rows for c in row))
    with open(path, "w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=columns)
        writer.writeheader()
        writer.writerows(rows)
    return path


def plot_reward_curves(runs: Sequence[SweepRun], path: Path) -> Path:
    """Reward per step, mean +- std over seeds, one line per grid point (Agg canvas: no display needed)."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    fig = Figure(figsize=(7, 4.2))
    FigureCanvasAgg(fig)
    ax = fig.add_subplot()
    for point, group in _by_point(runs).items():
        steps = min(len(r.rewards) for r in group)
        if steps == 0:
            continue
        mean, std = zip(*(_mean_std([r.rewards[i] for r in group]) for i in range(steps)))
        x = list(range(1, steps + 1))
        ax.plot(x, mean, marker="o", ms=3, label=f"{_label(point)} (n={len(group)})")
        ax.fill_between(x, [m - s for m, s in zip(mean, std)], [m + s for m, s in zip(mean, std)], alpha=0.2)
    ax.set_xlabel("RL step")
    ax.set_ylabel("rollout/reward_mean")
    ax.set_title("reward, mean +- std over seeds")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    return path


# ---- session reuse ------------------------------------------------------------------------------------------
def can_reuse(old: RunConfig, new: RunConfig) -> bool:
    """True when a session built for ``old`` can be reset for ``new`` (see :meth:`rlkit.session.Session.reset`)."""
    return Change.SESSION not in changes_needed(old, new).values()


# ---- the sweep ------------------------------------------------------------------------------------------------
def run_sweep(config: str | Path | Mapping[str, Any] | RunConfig, grid: Grid,
              base_overrides: Sequence[str] | Mapping[str, Any] = (), out_dir: Optional[str | Path] = None,
              progress: bool = False, reuse_sessions: bool = True, env: Any = None) -> SweepResult:
    """Run every combination of ``grid`` (its ``seed`` entry gives the seeds; a tuple of keys pairs their values,
    see the module docstring) on ``config`` with ``base_overrides``, and write the comparison into ``out_dir``.
    Every config is validated before the first run starts. wandb logging is on (offline unless configured) with
    one group per sweep; pass ``logger.wandb_enabled=false`` in ``base_overrides`` to turn it off. ``env``: an
    environment, or a reward function (``f(prompts, completions, **columns)``), that scores every run instead
    of the config's."""
    source = config.model_dump(mode="json") if isinstance(config, RunConfig) else config
    base = load_config(source, base_overrides)
    grid = {k: list(v) for k, v in grid.items()}
    seeds = grid.pop("seed", [base.seed])
    empty = [k for k, v in grid.items() if not v] + (["seed"] if not seeds else [])
    if empty:
        raise ConfigError([f"{k}: the grid lists no values" for k in empty])
    axes, axis_points = _axes(grid)
    env = _environment(env)
    folder = Path(out_dir or Path(base.logger.log_dir) / "sweeps" / f"{base.name}-{time.strftime('%Y%m%d-%H%M%S')}")
    folder.mkdir(parents=True, exist_ok=True)
    group = folder.name
    defaults = {"logger.wandb_enabled": True, "logger.wandb_group": group}
    user = parse_overrides(base_overrides)

    plan = []  # (name, point, seed, config): all validated before anything heavy starts
    problems = []
    for values in itertools.product(*axis_points):
        point = tuple((key, value) for keys, vals in zip(axes, values) for key, value in zip(keys, vals))
        for seed in seeds:
            name = run_name(base.name, point, seed)
            overrides = {**defaults, **user, **dict(point), "seed": seed, "name": name,
                         "logger.log_dir": str(folder)}
            try:
                plan.append((name, point, seed, load_config(source, overrides)))
            except ConfigError as e:
                problems += [f"run {name}: {p}" for p in e.problems]
    if problems:
        raise ConfigError(problems)

    runs: list[SweepRun] = []
    session = None
    try:
        for name, point, seed, cfg in plan:
            reused = session is not None and reuse_sessions and can_reuse(session.config, cfg)
            if reused:
                session.reset(cfg)
            else:
                if session is not None:
                    session.close()
                session = None
                session = Session(cfg, env=env)
            summary = run_experiment(cfg, session=session, progress=progress, run_dir=folder / name)
            rewards = tuple(m["rollout/reward_mean"] for m in session.history)
            runs.append(SweepRun(name, point, seed, folder / name, summary, rewards, reused))
    finally:
        if session is not None:
            session.close()
        result = _write_outputs(folder, group, {"+".join(k) if isinstance(k, tuple) else k: v for k, v in grid.items()},
                                seeds, user, runs)
    return result


def _environment(env: Any) -> Any:
    """``run_sweep``'s ``env``: an environment as it is, a reward function wrapped as one."""
    if env is None or isinstance(env, Environment):
        return env
    if callable(env):
        return RewardFunctionEnvironment(env)
    raise TypeError(f"run_sweep(env=...) takes an Environment or a reward function, got {type(env).__name__}")


def _write_outputs(folder: Path, group: str, grid: Mapping[str, list], seeds: Sequence[Any],
                   base_overrides: Mapping[str, Any], runs: Sequence[SweepRun]) -> SweepResult:
    table = comparison_table(runs)
    files = {}
    run_rows = [{"name": r.name, **dict(r.point), "seed": r.seed,
                 "final_reward": r.summary.get("reward_last_10_steps"),
                 "accuracy_before_rl": r.summary.get("accuracy_before_rl"),
                 "accuracy_after_rl": r.summary.get("accuracy_after_rl"),
                 "rl_steps": r.summary.get("rl_steps"), "wall_time_s": r.summary.get("wall_time_s"),
                 "reused_session": r.reused_session} for r in runs]
    if runs:
        files["runs_csv"] = _write_csv(folder / "runs.csv", run_rows)
        files["comparison_csv"] = _write_csv(folder / "comparison.csv", table)
        files["comparison_md"] = folder / "comparison.md"
        files["comparison_md"].write_text(_markdown(table))
        files["plot"] = plot_reward_curves(runs, folder / "reward_curves.png")
    files["sweep_json"] = folder / "sweep.json"
    files["sweep_json"].write_text(json.dumps({
        "group": group, "grid": grid, "seeds": list(seeds), "base_overrides": base_overrides,
        "runs": [{"name": r.name, "point": dict(r.point), "seed": r.seed, "run_dir": str(r.run_dir),
                  "rewards": list(r.rewards), "reused_session": r.reused_session} for r in runs],
        "table": table,
    }, indent=2, default=str))
    return SweepResult(folder, group, list(runs), table, files)
