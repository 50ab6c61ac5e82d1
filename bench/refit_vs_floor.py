"""A colocated refit, part by part, against its floor: vLLM's own reload of the same, ready-made HF tensors.

The floor is one ``reload_weights`` call (vLLM's public ``collective_rpc``) on HF tensors already in memory:
what a refit cannot avoid (vLLM's layer-by-layer reload, including its CPU weight prepacking). The refit adds
the policy's export (gathering, which is nothing at TP=1, and the Megatron -> HF layout conversion) and the
prefix-cache reset, and streams the export through one reload call. For comparison, the same refit as one reload
call per bucket (``--bucket-mb``, the transport of earlier versions), and a plain copy of the same bytes.
Parts and totals alternate over repeats (medians), so drift in machine load hits all of them alike; each is
timed in wall seconds and in this process's CPU seconds (all its threads), which a busy machine disturbs less.
25 repeats by default: with 9, three runs in a row at load 0.6-1.4 gave 0.81, 1.24 and 1.27 (the floor alone
swung 47-86 ms between runs), with 25 the next gave 1.13 (2026-12-01).

Usage: python bench/refit_vs_floor.py [--preset small] [--repeats 25] [--bucket-mb 4]
Prints ``refit / floor = <x>`` (target <= 1.2); last line: the figures as ``name=value`` (bench/run_all.py).
"""

from __future__ import annotations

import argparse
import os
import statistics
import tempfile
import time

import torch


def seconds(call) -> tuple[float, float]:
    """(wall, process CPU) seconds of ``call()``."""
    t0, c0 = time.perf_counter(), time.process_time()
    call()
    return time.perf_counter() - t0, time.process_time() - c0


def prepack_seconds(generator, weights) -> float:
    """Seconds of CPU weight prepacking (oneDNN matmul handles) inside one reload, from torch's profiler."""
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CPU]) as prof:
        reload(generator, weights)
    return sum(e.self_cpu_time_total for e in prof.key_averages() if "onednn" in e.key.lower()) / 1e6


def reload(generator, weights) -> None:
    generator.llm.collective_rpc("reload_weights", kwargs={"weights_iterator": weights, "is_checkpoint_format": True})


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--preset", default="small")
    parser.add_argument("--repeats", type=int, default=25)
    parser.add_argument("--bucket-mb", type=float, default=4.0, help="bucket size of the per-bucket comparison")
    args = parser.parse_args()

    from rlkit.config.components import GenerationConfig, PolicyConfig
    from rlkit.generation.vllm import VllmGenerator
    from rlkit.models import make_model
    from rlkit.models.factory import count_parameters
    from rlkit.policy.megatron.policy import MegatronPolicy
    from rlkit.weight_sync import ColocatedWeightSync
    from rlkit.weights import bucket_groups

    with tempfile.TemporaryDirectory() as tmp:
        path = make_model(tmp, args.preset, "llama")
        params = count_parameters(path)
        policy = MegatronPolicy(PolicyConfig(model_name=str(path)))
        generator = VllmGenerator(path, GenerationConfig(), max_model_len=64)
        sync = ColocatedWeightSync()
        sync.sync(policy, generator)  # warm-up

        groups = [[(n, t.clone()) for n, t in g] for g in policy.export_hf_groups()]  # ready-made HF tensors
        ready = [pair for g in groups for pair in g]
        buffers = [torch.empty_like(t) for _, t in ready]
        nbytes = sum(t.numel() * t.element_size() for _, t in ready)
        buckets = list(bucket_groups(groups, args.bucket_mb * 1e6))

        def per_bucket() -> None:  # a reload call per bucket of the export, then the reset
            for bucket in bucket_groups(policy.export_hf_groups(), args.bucket_mb * 1e6):
                generator.update_weights(bucket)
            generator.reset_prefix_cache()

        parts = {
            "refit (ColocatedWeightSync: export streamed into one reload, reset)": lambda: sync.sync(policy, generator),
            "floor: vLLM reload_weights of the same HF tensors, ready-made": lambda: reload(generator, ready),
            "  export (TP gather + Megatron -> HF layout conversion)": lambda: [g for g in policy.export_hf_groups()],
            "  bucketing into whole fused groups (broadcast only)": lambda: list(bucket_groups(iter(groups), args.bucket_mb * 1e6)),
            "  prefix-cache reset": generator.reset_prefix_cache,
            f"refit as one reload call per {args.bucket_mb:g} MB bucket ({len(buckets)} calls)": per_bucket,
            "plain copy of the same bytes (Tensor.copy_)": lambda: [d.copy_(t) for d, (_, t) in zip(buffers, ready)],
        }
        times: dict[str, list[float]] = {name: [] for name in parts}
        cpu: dict[str, list[float]] = {name: [] for name in parts}
        for _ in range(args.repeats):
            for name, call in parts.items():
                wall, used = seconds(call)
                times[name].append(wall)
                cpu[name].append(used)
        prepack = statistics.median(prepack_seconds(generator, ready) for _ in range(3))
        generator.close()
        policy.close()

    med = {name: statistics.median(v) for name, v in times.items()}
    med_cpu = {name: statistics.median(v) for name, v in cpu.items()}
    names = list(parts)
    refit, floor = med[names[0]], med[names[1]]
    cpu_ratio = med_cpu[names[0]] / med_cpu[names[1]]
    load = f"load average {os.getloadavg()[0]:.1f}" if hasattr(os, "getloadavg") else ""
    print(f"model: {args.preset} llama, {params / 1e6:.1f}M parameters, {nbytes / 1e6:.1f} MB fp32; "
          f"{args.repeats} repeats, medians; {os.cpu_count()} cores, {load}")
    print(f"{'':<75}{'wall':>12}{'CPU':>12}")
    for name in names:
        print(f"{name:<75}{med[name] * 1e3:9.2f} ms{med_cpu[name] * 1e3:9.2f} ms")
        if name == names[1]:
            print(f"{'  of which CPU weight prepacking (oneDNN handles; torch profiler)':<75}{prepack * 1e3:9.2f} ms")
    print(f"per-bucket reload calls / floor = {med[names[5]] / floor:.2f}; refit / plain copy = {refit / med[names[6]]:.1f}")
    print(f"refit / floor = {refit / floor:.2f} (target <= 1.2); in CPU seconds {cpu_ratio:.2f}")
    print(f"refit_over_floor={refit / floor:.3f} refit_over_floor_cpu={cpu_ratio:.3f} "
          f"per_bucket_calls_over_floor={med[names[5]] / floor:.3f} "
          f"per_bucket_calls_over_floor_cpu={med_cpu[names[5]] / med_cpu[names[1]]:.3f} "
          f"refit_ms={refit * 1e3:.2f} floor_ms={floor * 1e3:.2f} export_ms={med[names[2]] * 1e3:.2f} "
          f"prepack_ms={prepack * 1e3:.2f} reset_ms={med[names[4]] * 1e3:.3f}")


if __name__ == "__main__":
    main()
