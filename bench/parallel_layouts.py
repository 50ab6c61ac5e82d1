"""Training step time of each 2-process Megatron layout divided by one process's, same model and batch.

The layouts (Ray worker groups over gloo, one thread per rank) are DP=2, TP=2, TP=2 with sequence
parallelism and PP=2 (Megatron's 1F1B schedule); the reference is the in-process policy with two threads, so
both sides use the machine's two cores. For each layout the group is started, then steps alternate between
the group and the reference on the same batch (full optimizer steps, token-mean NLL), so drift in machine
load hits both; medians after warm-up. On a CPU this measures the cost of the collectives and of the
pipeline bubble, not a speed-up: the ranks share two cores.
Usage: python bench/parallel_layouts.py [--preset small] [--steps 3]
"""

from __future__ import annotations

import argparse
import os
import statistics
import tempfile
import time

import torch

LAYOUTS = {
    "DP=2": {},
    "TP=2": {"tensor_model_parallel_size": 2},
    "TP=2+SP": {"tensor_model_parallel_size": 2, "sequence_parallel": True},
    "PP=2": {"pipeline_model_parallel_size": 2},
}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--preset", default="small")
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--seq", type=int, default=256)
    parser.add_argument("--micro-batch", type=int, default=2, help="PP=2 needs several microbatches per rank")
    parser.add_argument("--steps", type=int, default=3)
    parser.add_argument("--warmup", type=int, default=1)
    args = parser.parse_args()
    os.environ.setdefault("HF_HUB_OFFLINE", "1")

    from megatron_vs_dtensor import make_batch  # the same synthetic batch as the backend comparison

    from rlkit.config.backends import MegatronConfig
    from rlkit.config.components import PolicyConfig
    from rlkit.models import make_model
    from rlkit.models.factory import count_parameters
    from rlkit.policy.megatron.policy import MegatronPolicy
    from rlkit.policy.workers import RayPolicyGroup, start_ray
    from rlkit.stages.sft import nll_loss

    started = start_ray(num_cpus=os.cpu_count())
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        path = make_model(f"{tmp}/model", args.preset, "llama", seed=0)
        cfg = PolicyConfig(model_name=str(path), train_micro_batch_size=args.micro_batch, max_total_sequence_length=args.seq)
        single = MegatronPolicy(cfg)
        batch = make_batch(args.batch, args.seq, single.arch.vocab_size)
        for name, layout in LAYOUTS.items():
            group = RayPolicyGroup(cfg.model_copy(update={"megatron_cfg": MegatronConfig(**layout)}), world_size=2)
            times: dict[str, list[float]] = {"group": [], "single": []}
            try:
                for i in range(args.warmup + args.steps):
                    for side, policy in (("group", group), ("single", single)):
                        t0 = time.perf_counter()
                        policy.train_step(batch, nll_loss)
                        if i >= args.warmup:
                            times[side].append(time.perf_counter() - t0)
            finally:
                group.close()
            rows.append((name, statistics.median(times["group"]), statistics.median(times["single"])))
        params = count_parameters(path)
        single.close()
    if started:
        import ray

        ray.shutdown()

    print(f"model: preset {args.preset!r}, {params / 1e6:.1f}M parameters, fp32; batch {args.batch} x {args.seq} "
          f"tokens, micro-batch {args.micro_batch}; one process with {torch.get_num_threads()} threads vs 2 ranks x 1")
    for name, group_s, single_s in rows:
        print(f"{name:8s} step: median {group_s * 1e3:8.1f} ms vs one process {single_s * 1e3:8.1f} ms: "
              f"ratio {group_s / single_s:.2f}")
    print(" ".join(f"{''.join(c if c.isalnum() else '_' for c in name.lower())}_over_one_process={g / s:.3f}"
                   for name, g, s in rows))


if __name__ == "__main__":
    main()
