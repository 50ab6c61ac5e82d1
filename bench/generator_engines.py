"""The three generation engines on the same prompts, side by side: vLLM (its own copy of the weights), transformers'
``generate`` (its own copy) and the Megatron generator (the policy's own model, no copy), on the quickstart's model.

One session (the quickstart preset, Megatron policy, vLLM engine in this process); the other two engines are built
beside it on the same weights: transformers' from the model folder, Megatron's from the session's policy
(``policy.own_generator``). Each round samples one rollout batch of prompts (``grpo.num_prompts_per_step`` x
``grpo.num_generations_per_prompt``, the preset's sampling settings, the same call seed) with each engine in turn,
so drift in machine load hits all three alike. Reported per engine: generated tokens per second of wall time and per
process CPU-second (the steadier figure on a shared machine), and the ratios to vLLM. The engines sample different
tokens (different kernels and random streams), so the tokens, not the calls, are what is compared.

Usage: python bench/generator_engines.py [--rounds 6] [dotted overrides, e.g. grpo.num_prompts_per_step=16]
"""

from __future__ import annotations

import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("WANDB_MODE", "offline")

import argparse  # noqa: E402
import statistics  # noqa: E402
import sys  # noqa: E402
import tempfile  # noqa: E402
import time  # noqa: E402
from pathlib import Path  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run from a checkout without installing


def main(argv=None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=6)
    parser.add_argument("--preset", default="quickstart")
    parser.add_argument("overrides", nargs="*", help="dotted config overrides")
    args = parser.parse_args(argv)

    import rlkit
    from rlkit.config.components import GenerationConfig
    from rlkit.data.chat import render_prompts
    from rlkit.generation.hf import HFGenerator

    overrides = dict(o.split("=", 1) for o in args.overrides)
    with tempfile.TemporaryDirectory() as workdir:
        overrides.setdefault("logger.log_dir", f"{workdir}/runs")
        with rlkit.Session.from_config(args.preset, overrides) as s:
            run, p = s.current, s.config.policy
            engines = {"vllm": run.generator,
                       "hf": HFGenerator(p.model_name, GenerationConfig(backend="hf"), max_model_len=p.max_model_len),
                       "megatron": run.policy.own_generator(p.generation, p.max_model_len, s.config.seed)}
            rows = s.sampler.next_batch(s.config.grpo.num_prompts_per_step)
            prompts = render_prompts(s.components.tokenizer, [r["prompt"] for r in rows], s.config.data.system_prompt)
            sampling = run.sampling(seed=0)
            n = s.config.grpo.num_generations_per_prompt
            seen: dict[str, list[tuple[int, float, float]]] = {name: [] for name in engines}
            for _ in range(args.rounds):
                for name, engine in engines.items():
                    wall0, cpu0 = time.perf_counter(), time.process_time()
                    out = engine.generate(prompts, n, sampling)
                    seen[name].append((sum(len(t) for t in out.token_ids), time.perf_counter() - wall0,
                                       time.process_time() - cpu0))
    result = {}
    for name, calls in seen.items():
        calls = calls[1:] or calls  # the first call warms each engine up
        result[name] = {"tokens_per_s": statistics.median(t / w for t, w, _ in calls),
                        "tokens_per_cpu_s": statistics.median(t / c for t, _, c in calls),
                        "tokens_per_call": statistics.median(t for t, _, _ in calls)}
    load = os.getloadavg()[0]
    print(f"{args.preset}: {len(prompts)} prompts x {n} samples, {args.rounds} rounds (first left out), "
          f"load {load:.1f}")
    print(f"{'engine':9s} {'tok/s':>9s} {'tok/CPU-s':>10s} {'tok/call':>9s} {'vs vLLM (wall)':>15s} {'(CPU)':>7s}")
    for name, r in result.items():
        print(f"{name:9s} {r['tokens_per_s']:9.0f} {r['tokens_per_cpu_s']:10.0f} {r['tokens_per_call']:9.0f} "
              f"{r['tokens_per_s'] / result['vllm']['tokens_per_s']:15.2f} "
              f"{r['tokens_per_cpu_s'] / result['vllm']['tokens_per_cpu_s']:7.2f}")
    return result


if __name__ == "__main__":
    main()
