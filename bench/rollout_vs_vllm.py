"""Rollout tokens/s through rlkit's rollout stage against raw vLLM ``LLM.generate`` on the same engine.

Both sides sample the same prompts (rendered with the chat template and tokenized once for the raw side) with
the same ``SamplingParams`` (n, temperature, top_p, top_k, max_tokens, logprobs=0, the same per-request seeds),
so they generate the same tokens; they alternate call by call so drift in machine load hits both equally.
On a shared machine the wall-clock rate swings with other people's load, so tokens per process CPU-second
(every thread of the process) is printed as well: it is the steadier figure of the two. One thread, as in
bench/same_work.py: with two OpenMP threads on two shared cores, a busy neighbour made every call up to 20x
slower (the waiting thread spins), which swamped the ratio.
What rlkit adds on top of ``generate``: rendering and tokenizing the prompts, the prefill-chunking check,
reading the token logprobs, and the padded ``Trajectories`` tensors. Target: ratio >= 0.95.

Usage: python bench/rollout_vs_vllm.py [--rounds 10] [dotted overrides, e.g. grpo.num_prompts_per_step=64]
"""

from __future__ import annotations

import os

os.environ["OMP_NUM_THREADS"] = "1"  # before torch is imported
os.environ.setdefault("HF_HUB_OFFLINE", "1")

import argparse  # noqa: E402
import statistics  # noqa: E402
import tempfile  # noqa: E402
import time  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--rounds", type=int, default=20)
    parser.add_argument("overrides", nargs="*", help="dotted config overrides")
    args = parser.parse_args()

    import torch

    torch.set_num_threads(1)
    import rlkit
    from rlkit import stages
    from rlkit.data import render_prompt_texts
    from vllm import SamplingParams

    with tempfile.TemporaryDirectory() as tmp:
        s = rlkit.Session.from_config("quickstart", {
            "policy.model_name": f"{tmp}/model", "sft.enabled": False, "grpo.use_dynamic_sampling": False,
            "data.num_train": 2000, "data.num_validation": 16, **dict(o.split("=", 1) for o in args.overrides)})
        g, sampling = s.config.grpo, s.sampling()
        rows = s.sampler.next_batch(g.num_prompts_per_step)
        texts = render_prompt_texts(s.tokenizer, [r["prompt"] for r in rows], s.config.data.system_prompt)
        prompts = [{"prompt_token_ids": s.tokenizer(t, add_special_tokens=False)["input_ids"]} for t in texts]

        def params() -> list:  # fresh per call, as the rollout stage makes them
            return [SamplingParams(n=g.num_generations_per_prompt, temperature=sampling.temperature,
                                   top_p=sampling.top_p, top_k=sampling.top_k or 0, max_tokens=sampling.max_new_tokens,
                                   stop=list(sampling.stop_strings) or None, logprobs=0, seed=sampling.seed + i)
                    for i in range(len(prompts))]

        def rlkit_rollout() -> int:
            batch = stages.rollout(s.generator, s.tokenizer, rows, g.num_generations_per_prompt, sampling,
                                   s.policy.version, s.config.data.system_prompt)
            return int(batch.completion_lengths.sum())

        def raw_generate() -> int:
            outputs = s.generator.llm.generate(prompts, params(), use_tqdm=False)
            return sum(len(o.token_ids) for request in outputs for o in request.outputs)

        for _ in range(2):  # warm-up both
            counts = rlkit_rollout(), raw_generate()
        rates: dict[str, list[float]] = {"rlkit": [], "vllm": []}
        per_cpu: dict[str, list[float]] = {"rlkit": [], "vllm": []}
        for i in range(args.rounds):
            for name, call in (("rlkit", rlkit_rollout), ("vllm", raw_generate))[::1 if i % 2 else -1]:
                t0, c0 = time.perf_counter(), time.process_time()
                tokens = call()
                rates[name].append(tokens / (time.perf_counter() - t0))
                per_cpu[name].append(tokens / (time.process_time() - c0))
        s.close()

    a, b = statistics.median(rates["rlkit"]), statistics.median(rates["vllm"])
    ca, cb = statistics.median(per_cpu["rlkit"]), statistics.median(per_cpu["vllm"])
    print(f"{len(prompts)} prompts x {g.num_generations_per_prompt} samples, up to {sampling.max_new_tokens} "
          f"new tokens, {args.rounds} alternating rounds")
    print(f"tokens per call: rlkit {counts[0]}, vLLM {counts[1]} (the same seeds: the same tokens)")
    print(f"rlkit rollout stage:  median {a:9.0f} tokens/s")
    print(f"raw vLLM generate:    median {b:9.0f} tokens/s")
    print(f"tokens per CPU-second: rlkit {ca:.0f}, vLLM {cb:.0f}, ratio {ca / cb:.3f}")
    print(f"ratio rlkit / vLLM: {a / b:.3f} (target >= 0.95)")
    print(f"rollout_over_vllm={a / b:.3f} rollout_over_vllm_per_cpu_s={ca / cb:.3f} vllm_tokens_per_s={b:.0f}")


if __name__ == "__main__":
    main()
