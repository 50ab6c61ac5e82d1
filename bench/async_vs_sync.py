"""RL steps per minute, async GRPO (max age 1) next to synchronous GRPO, for each policy backend and generator
placement.

Each run is a fresh Session on the quickstart task (no SFT: throughput does not need a trained model) that
takes ``--warmup`` steps, then is timed over ``--steps`` steps of ``session.run``. Policy backends: Megatron-Core
and DTensor (FSDP2). Placements: the vLLM engine in this process (``colocated``) and in a Ray actor (``remote``,
refit by broadcast). The same script runs on a GPU machine unchanged (the components pick CUDA when it is there).

The headline compares the defaults, as a user gets them: sync runs the engine in this process and async, with
``policy.generation.colocated.enabled`` unset, in a Ray actor (:func:`rlkit.config.components.generation_colocated`).
``<backend>_async_over_sync`` is async (actor) over sync (in process) steps per minute; ``async_over_sync`` is the
lower of the backends. The same-placement ratios are printed too: they show why the actor is async's default.

What to expect: async overlaps sampling step k+1 with training step k, so the best case is
max(generate, train) per step instead of their sum. In-process, the two share the interpreter (the GIL) and
the same cores; with the engine in its own process they share only the cores, split between them
(:func:`rlkit.generation.remote.split_cores`).

Each run (backend, placement, mode) is a fresh Python process, as a user's session would be: once an in-process
vLLM engine has started, vLLM makes ``torch.set_num_threads`` a no-op for the rest of the process, so a run after
another in the same process may not get the threads it asks for. (Until 2026-12-01 the sync and async runs of a
pair shared one process; Megatron's sync in process then ran at 101 steps/min, against 135.5 in a process of its own.)

Repeats: on a 2-core machine one run of each mode swings by +-20% (the two modes train different policies,
whose samples differ in length and in dynamic sampling's rounds, and the machine is shared), so each pair runs
``--repeats`` times, sync first and async first in turn, and the table and ratios use the medians; ``spread``
is the lowest and highest ratio of one repeat's async over the same repeat's sync.
``gen/step`` (generation calls per step) and ``tokens`` (mean completion length) show whether the two modes
did the same work per step.
Usage: python bench/async_vs_sync.py [--steps 20] [--warmup 3] [--repeats 3] [--backends megatron,dtensor]
                                     [--placements colocated,remote] [--preset tiny]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time


BACKENDS = {"megatron": {}, "dtensor": {"policy.megatron_cfg.enabled": False, "policy.dtensor_cfg.enabled": True}}


def run(backend: str, placement: str, asynchronous: bool, args: argparse.Namespace, model_dir: str) -> dict[str, float]:
    import rlkit

    overrides = {**BACKENDS[backend],
        "policy.model_name": f"{model_dir}/model", "policy.model_preset": args.preset, "sft.enabled": False,
        "data.num_train": 4000, "data.num_validation": 16,
        "policy.generation.colocated.enabled": placement == "colocated",
        "grpo.async_grpo.enabled": asynchronous, "grpo.async_grpo.max_trajectory_age_steps": 1,
        "loss_fn.off_policy_correction": "tis" if asynchronous else "none",
        "logger.log_dir": f"{model_dir}/runs",
    }
    with rlkit.Session.from_config("quickstart", overrides) as s:
        s.run(args.warmup, progress=False)
        t0 = time.perf_counter()
        history = s.run(args.steps, progress=False)
        seconds = time.perf_counter() - t0
    mean = lambda key: statistics.fmean(m.get(key, 0.0) for m in history)  # noqa: E731
    return {
        "steps_per_minute": 60 * len(history) / seconds,
        "step_s": seconds / len(history),
        "rollout_s": mean("timing/rollout"),
        "train_s": mean("timing/train"),
        "refit_s": mean("timing/refit"),
        # sync: the trainer waits for the whole rollout; async: for a batch, and before a refit for the batch
        # being sampled
        "trainer_idle_s": mean("timing/trainer_idle") + mean("timing/refit_wait") if asynchronous else mean("timing/rollout"),
        # sync: the engine idles for everything but the rollout
        "generator_idle_s": mean("timing/generator_idle") if asynchronous else seconds / len(history) - mean("timing/rollout"),
        "lag": mean("rollout/policy_lag"),
        "reward": mean("rollout/reward_mean"),
        "gen_calls": mean("dynamic_sampling/tries") or 1.0,  # dynamic sampling's generation rounds per step
        "tokens": mean("rollout/gen_length_mean"),
    }


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument("--backends", default="megatron,dtensor")
    parser.add_argument("--placements", default="colocated,remote")
    parser.add_argument("--preset", default="tiny", help="model preset (tiny: the quickstart's ~0.8M model)")
    parser.add_argument("--repeats", type=int, default=3, help="fresh-process runs of each pair (medians used)")
    parser.add_argument("--json-out", help=argparse.SUPPRESS)  # one run, as JSON (the child's mode)
    parser.add_argument("--mode", choices=("sync", "async"), help=argparse.SUPPRESS)  # the child's run
    args = parser.parse_args()
    backends, placements = args.backends.split(","), args.placements.split(",")

    if args.json_out:
        with tempfile.TemporaryDirectory() as tmp:
            result = run(backends[0], placements[0], args.mode == "async", args, tmp)
        with open(args.json_out, "w") as f:
            json.dump(result, f)
        return

    import torch

    repeats: dict[tuple[str, str, bool], list[dict[str, float]]] = {}
    with tempfile.TemporaryDirectory() as tmp:
        for repeat in range(args.repeats):
            for backend in backends:
                for placement in placements:
                    for asynchronous in (False, True)[::-1 if repeat % 2 else 1]:
                        out = f"{tmp}/{backend}-{placement}-{asynchronous}-{repeat}.json"
                        subprocess.run([sys.executable, __file__, "--backends", backend, "--placements", placement,
                                        "--json-out", out, "--mode", "async" if asynchronous else "sync",
                                        "--steps", str(args.steps), "--warmup", str(args.warmup),
                                        "--preset", args.preset], check=True)
                        with open(out) as f:
                            repeats.setdefault((backend, placement, asynchronous), []).append(json.load(f))
    results = {key: {k: statistics.median(r[k] for r in runs) for k in runs[0]} for key, runs in repeats.items()}

    device = torch.cuda.get_device_name(0) if torch.cuda.is_available() else f"CPU, {os.cpu_count()} cores"
    load = f", load average {os.getloadavg()[0]:.1f}" if hasattr(os, "getloadavg") else ""
    print(f"quickstart task, {args.preset} model, {args.steps} timed steps after {args.warmup} warm-up, medians of "
          f"{args.repeats} repeat(s); {device}{load}")
    print(f"{'backend':<9} {'placement':<10} {'mode':<6} {'steps/min':>9} {'step s':>7} {'rollout s':>9} {'train s':>8} "
          f"{'refit s':>8} {'trainer idle s':>14} {'gen idle s':>10} {'lag':>4} {'gen/step':>8} {'tokens':>6}")
    for (backend, placement, asynchronous), r in results.items():
        print(f"{backend:<9} {placement:<10} {'async' if asynchronous else 'sync':<6} {r['steps_per_minute']:>9.1f} "
              f"{r['step_s']:>7.3f} {r['rollout_s']:>9.3f} {r['train_s']:>8.3f} {r['refit_s']:>8.3f} "
              f"{r['trainer_idle_s']:>14.3f} {r['generator_idle_s']:>10.3f} {r['lag']:>4.2f} {r['gen_calls']:>8.2f} "
              f"{r['tokens']:>6.1f}")

    def ratio_of(backend: str, async_placement: str, sync_placement: str, label: str) -> float:
        """Median async over median sync steps per minute, printed with the spread of the repeats' ratios."""
        rates = [[r["steps_per_minute"] for r in repeats[backend, p, a]] for p, a in
                 ((async_placement, True), (sync_placement, False))]
        each = [a / s for a, s in zip(*rates)]
        ratio = statistics.median(rates[0]) / statistics.median(rates[1])
        print(f"{backend}, {label}: async / sync steps per minute = {ratio:.2f}x "
              f"(repeats {min(each):.2f}-{max(each):.2f})")
        return ratio

    figures, defaults = {}, []
    for backend in backends:
        for placement in placements:
            figures[f"{backend}_{placement}_async_over_sync"] = ratio_of(backend, placement, placement,
                                                                         f"both {placement}")
        if {"colocated", "remote"} <= set(placements):
            ratio = ratio_of(backend, "remote", "colocated",
                             "the defaults (async in a Ray actor, sync in this process)")
            figures[f"{backend}_async_over_sync"] = ratio
            defaults.append(ratio)
    if defaults:  # issue 17: async at least as fast as sync on every backend, as each is set up by default
        figures["async_over_sync"] = min(defaults)
        print(f"async / sync with the default placements, the lower of the backends: "
              f"{figures['async_over_sync']:.2f}x (target >= 1.0)")
    print(" ".join(f"{k}={v:.3f}" for k, v in figures.items()))


if __name__ == "__main__":
    main()
