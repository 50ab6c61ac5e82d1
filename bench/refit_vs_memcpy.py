"""Refit time of a ~20M-parameter model divided by a plain memory copy of the same bytes, in one run.

Both sides move the same HF-named fp32 tensors: the refit pushes them through vLLM's reload_weights (in
buckets of whole fused groups, then the prefix-cache reset); the baseline copies them into preallocated
buffers with ``Tensor.copy_``. Medians over repeats. Usage: python bench/refit_vs_memcpy.py [--preset small]
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time

import torch


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--preset", default="small")
    parser.add_argument("--repeats", type=int, default=7)
    args = parser.parse_args()

    from rlkit.config.components import GenerationConfig, PolicyConfig
    from rlkit.generation.vllm import VllmGenerator
    from rlkit.models import make_model
    from rlkit.models.factory import count_parameters
    from rlkit.policy.megatron.policy import MegatronPolicy
    from rlkit.weight_sync import ColocatedWeightSync

    with tempfile.TemporaryDirectory() as tmp:
        path = make_model(tmp, args.preset, "llama")
        params = count_parameters(path)
        policy = MegatronPolicy(PolicyConfig(model_name=str(path)))
        generator = VllmGenerator(path, GenerationConfig(), max_model_len=64)
        sync = ColocatedWeightSync()
        sync.sync(policy, generator)  # warm-up

        tensors = [t for group in policy.export_hf_groups() for _, t in group]
        buffers = [torch.empty_like(t) for t in tensors]
        nbytes = sum(t.numel() * t.element_size() for t in tensors)

        refit, copy = [], []
        for _ in range(args.repeats):
            refit.append(sync.sync(policy, generator).seconds)
            t0 = time.perf_counter()
            for dst, src in zip(buffers, tensors):
                dst.copy_(src)
            copy.append(time.perf_counter() - t0)
        generator.close()
        policy.close()

    r, c = statistics.median(refit), statistics.median(copy)
    print(f"model: {args.preset} llama, {params / 1e6:.1f}M parameters, {nbytes / 1e6:.1f} MB fp32")
    print(f"refit (vLLM reload_weights + prefix-cache reset): {r * 1e3:8.2f} ms  ({nbytes / r / 1e9:.2f} GB/s)")
    print(f"plain memory copy of the same bytes:              {c * 1e3:8.2f} ms  ({nbytes / c / 1e9:.2f} GB/s)")
    print(f"ratio refit / memcpy: {r / c:.2f}")


if __name__ == "__main__":
    main()
