"""CPU-seconds per RL step and peak RSS on a fixed tiny workload, the figure issue 17 compares with TRL's.

The work: the quickstart's model and task, 16 prompts x 8 samples, no dynamic sampling, fp32, one thread
(``OMP_NUM_THREADS=1`` and ``torch.set_num_threads(1)``, set before torch is imported). SFT is off: a random
model does the same work per step (same lengths up to ``max_new_tokens``), and the bench starts in seconds.
CPU time, not wall time, because this machine is shared: the process's CPU seconds over the steady-state steps
(every thread of the process, vLLM's in-process engine included). Stage by stage: each stage called directly on
the session's components with the process CPU time around it (the same calls ``Session.step()`` makes).

Usage: python bench/same_work.py [--steps 20] [--profile out.prof]
Last line: ``cpu_s_per_step=<x> peak_rss_mb=<y>`` (target: x <= 0.73, TRL's figure; y <= 1500).
"""

from __future__ import annotations

import os

os.environ["OMP_NUM_THREADS"] = "1"
os.environ.setdefault("HF_HUB_OFFLINE", "1")

import argparse  # noqa: E402
import warnings  # noqa: E402
import resource  # noqa: E402
import statistics  # noqa: E402
import tempfile  # noqa: E402
import time  # noqa: E402
from collections import defaultdict  # noqa: E402

STAGES = ("rollout", "score", "logprobs", "advantages", "train", "refit")


def stage_step(s, cpu: dict) -> None:
    """One RL step by the stage functions, adding each stage's process CPU seconds to ``cpu``."""
    from rlkit import stages

    g = s.config.grpo
    rows = s.sampler.next_batch(g.num_prompts_per_step)
    calls = [
        ("rollout", lambda _: stages.rollout(s.generator, s.tokenizer, rows, s.sampling(), s.policy.version,
                                             s.settings.rollout)),
        ("score", lambda b: stages.score(b, s.env)),
        ("logprobs", lambda b: stages.logprobs(b, s.policy, s.loss_fn.needs_reference)),
        ("advantages", lambda b: stages.advantages(b, g.advantage_estimator, g.advantage_params(), s.baseline)),
        ("train", lambda b: (stages.train(b, s.policy, s.loss_fn, s.settings.train), b)[1]),
        ("refit", lambda b: (stages.refit(s.policy, s.generator, s.weight_sync), b)[1]),
    ]
    batch = None
    for name, call in calls:
        t0 = time.process_time()
        batch = call(batch)
        cpu[name].append(time.process_time() - t0)
    s.generator_version = s.policy.version  # keep the session's bookkeeping: no extra refit in its next step()


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument("--profile", default=None, help="write a cProfile of extra session steps here")
    parser.add_argument("overrides", nargs="*", help="dotted config overrides, e.g. policy.train_micro_batch_size=64")
    args = parser.parse_args()

    import torch

    torch.set_num_threads(1)
    warnings.filterwarnings("ignore", message=".*identical rewards")  # a random model gets no reward: same work
    import rlkit

    with tempfile.TemporaryDirectory() as tmp:
        s = rlkit.Session.from_config("quickstart", {
            "policy.model_name": f"{tmp}/model", "sft.enabled": False, "grpo.use_dynamic_sampling": False,
            "grpo.num_prompts_per_step": 16, "grpo.num_generations_per_prompt": 8,
            "data.num_train": 4000, "data.num_validation": 16, **dict(o.split("=", 1) for o in args.overrides)})
        rss_started = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
        for _ in range(args.warmup):
            s.step()
        c0, w0 = time.process_time(), time.perf_counter()
        history = [s.step() for _ in range(args.steps)]
        cpu_per_step, wall_per_step = (time.process_time() - c0) / args.steps, (time.perf_counter() - w0) / args.steps
        cpu: dict[str, list[float]] = defaultdict(list)
        for _ in range(args.steps):
            stage_step(s, cpu)
        if args.profile:
            import cProfile

            with cProfile.Profile() as profiler:
                for _ in range(args.steps):
                    s.step()
            profiler.dump_stats(args.profile)
        s.close()
    peak_rss_mb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # Linux: KiB

    print(f"torch threads {torch.get_num_threads()}, {args.steps} steps after {args.warmup} warm-up, "
          f"load average {os.getloadavg()[0]:.2f}")
    print(f"{'stage':<20}{'CPU s (median)':>16}{'wall s in step()':>18}")
    for name in STAGES:
        wall = statistics.median(m.get(f"timing/{name}", 0.0) for m in history)
        print(f"{name:<20}{statistics.median(cpu[name]):>16.4f}{wall:>18.4f}")
    for name in ("reference_logprobs", "metrics", "other"):
        print(f"{name:<20}{'':>16}{statistics.median(m.get(f'timing/{name}', 0.0) for m in history):>18.4f}")
    print(f"{'stages summed':<20}{sum(statistics.median(v) for v in cpu.values()):>16.4f}")
    print(f"peak RSS after start-up {rss_started:.0f} MB")
    print(f"Session.step(): {cpu_per_step:.4f} CPU s per step, {wall_per_step:.4f} wall s per step")
    print(f"cpu_s_per_step={cpu_per_step:.3f} peak_rss_mb={peak_rss_mb:.0f}")


if __name__ == "__main__":
    main()
