"""Refit under LoRA: the merged-weights reload (what rlkit does) against vLLM's own LoRA adapter loading.

Merged: the policy exports ``W + alpha/dim * B @ A`` under HF names and vLLM reloads every weight
(:class:`rlkit.weight_sync.ColocatedWeightSync`). Adapter: the policy writes a PEFT adapter folder to /dev/shm
and an engine started with ``enable_lora=True`` loads it as a new ``LoRARequest`` (``llm_engine.add_lora``), which
every later generate then names. Each path is timed per refit (median of ``--repeats``), checked for exactness
(max |vLLM logprob - policy logprob| over sampled tokens), and its generation timed, because vLLM's LoRA
kernels (punica, on the CPU) run on every decoding step after the refit.

Usage: python bench/lora_refit.py [--preset small] [--rank 16] [--repeats 5]
Last line: the figures as ``name=value``.
"""

from __future__ import annotations

import argparse
import os
import statistics
import tempfile
import time

import torch


def mismatch(generate, policy, prompts, seed) -> float:
    """Max |generator - policy| logprob over the tokens sampled by ``generate(prompts, params)``."""
    from vllm import SamplingParams

    outs = generate(prompts, SamplingParams(n=4, max_tokens=24, logprobs=0, seed=seed, temperature=1.0))
    worst = 0.0
    for prompt, out in zip(prompts, outs):
        for c in out.outputs:
            ids = torch.tensor([prompt["prompt_token_ids"] + list(c.token_ids)])
            mine = policy.logprobs(ids, torch.ones_like(ids)).logprobs[0, len(prompt["prompt_token_ids"]):]
            theirs = torch.tensor([next(iter(lp.values())).logprob for lp in c.logprobs])
            worst = max(worst, (mine - theirs).abs().max().item())
    return worst


def timed_generate(generate, prompts) -> float:
    from vllm import SamplingParams

    t0 = time.perf_counter()
    generate(prompts, SamplingParams(n=4, max_tokens=32, seed=0, ignore_eos=True))
    return time.perf_counter() - t0


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--preset", default="small")
    parser.add_argument("--rank", type=int, default=16)
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args()

    from vllm import LLM
    from vllm.lora.request import LoRARequest

    from rlkit.config.components import GenerationConfig, PolicyConfig
    from rlkit.generation.vllm import VllmGenerator, _cpu_engine_environment
    from rlkit.models.factory import make_model
    from rlkit.policy.backends import in_process_policy
    from rlkit.policy.lora import write_adapter_folder
    from rlkit.weight_sync import ColocatedWeightSync

    folder = tempfile.mkdtemp(prefix="lora-refit-")
    path = str(make_model(folder, args.preset, "llama", seed=0))
    cfg = PolicyConfig(model_name=path, lora_cfg={"enabled": True, "dim": args.rank, "alpha": 2 * args.rank})
    policy = in_process_policy(cfg)

    def train_adapters(version: int) -> None:  # stands in for an optimizer step: new, non-zero adapters
        g = torch.Generator().manual_seed(version)
        with torch.no_grad():
            for name, p in policy.model.named_parameters():
                if ".lora_B" in name:
                    p.copy_(torch.randn(p.shape, generator=g) * 0.02)
        policy.version = version

    prompts = [{"prompt_token_ids": [1 + (i * 7 + j) % 12 for j in range(8)]} for i in range(64)]
    figures = {}

    # ---- merged weights, reloaded -------------------------------------------------------------------------
    generator = VllmGenerator(path, GenerationConfig(), max_model_len=128, seed=0)
    sync, times = ColocatedWeightSync(), []
    for k in range(args.repeats):
        train_adapters(k + 1)
        times.append(sync.sync(policy, generator).seconds)
    figures["merged_refit_s"] = statistics.median(times)
    figures["merged_max_diff"] = mismatch(lambda p, s: generator.llm.generate(p, s, use_tqdm=False), policy, prompts[:8], 1)
    figures["merged_generate_s"] = timed_generate(lambda p, s: generator.llm.generate(p, s, use_tqdm=False), prompts)
    generator.close()

    # ---- vLLM's LoRA adapters -----------------------------------------------------------------------------
    os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"
    _cpu_engine_environment()
    llm = LLM(model=path, dtype="float32", seed=0, enforce_eager=True, max_model_len=128,
              logprobs_mode="processed_logprobs", kv_cache_memory_bytes=2**28, enable_lora=True,
              max_lora_rank=args.rank, max_loras=1)
    train_adapters(0)  # the engine holds the base weights: adapters with B = 0 first
    shm = tempfile.mkdtemp(prefix="lora-adapter-", dir="/dev/shm" if os.path.isdir("/dev/shm") else None)
    times, request = [], None
    for k in range(args.repeats):
        train_adapters(k + 1)
        t0 = time.perf_counter()
        out = write_adapter_folder(policy.export_adapter_tensors(), cfg.lora_cfg, path, f"{shm}/v{k + 1}")
        if request is not None:
            llm.llm_engine.remove_lora(request.lora_int_id)
        request = LoRARequest(f"v{k + 1}", k + 1, str(out))
        llm.llm_engine.add_lora(request)
        llm.reset_prefix_cache()
        times.append(time.perf_counter() - t0)
    figures["adapter_refit_s"] = statistics.median(times)

    def generate(p, s):
        return llm.generate(p, s, use_tqdm=False, lora_request=request)

    figures["adapter_max_diff"] = mismatch(generate, policy, prompts[:8], 1)
    figures["adapter_generate_s"] = timed_generate(generate, prompts)
    policy.close()
    for k, v in figures.items():
        print(f"{k:>20}: {v:.4g}")
    print(" ".join(f"{k}={v:.4g}" for k, v in figures.items()))


if __name__ == "__main__":
    main()
