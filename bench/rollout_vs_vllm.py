"""Rollout tokens/s through rlkit's rollout stage against raw vLLM ``LLM.generate`` on the same engine.

Both sides sample the same prompts (rendered with the chat template and tokenized once for the raw side) with
the same ``SamplingParams`` (n, temperature, top_p, top_k, max_tokens, logprobs=0, the same per-request seeds),
so they generate the same tokens; they alternate call by call so drift in machine load hits both equally.
On a shared machine the wall-clock rate swings with other people's load, so tokens per process CPU-second
(every thread of the process) is printed as well: it is the steadier figure of the two. One thread, as in
bench/same_work.py: with two OpenMP threads on two shared cores, a busy neighbour made every call up to 20x
slower (the waiting thread spins), which swamped the ratio.
What rlkit adds on top of ``generate``: rendering and tokenizing the prompts, the prefill-chunking check,
reading the token logprobs, decoding the texts, and the padded ``Trajectories`` tensors. rlkit asks the engine not
to detokenize and for flat logprobs (``VllmGenerator.sample``) and decodes the completions itself, so a third
side, raw ``generate`` with those same engine-side settings, shows what rlkit's own work costs; the target
(ratio >= 0.95) is against raw ``generate`` with vLLM's defaults, what a user writing it by hand gets.

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

        def params(**engine_side) -> list:  # fresh per call, as the rollout stage makes them
            return [SamplingParams(n=g.num_generations_per_prompt, temperature=sampling.temperature,
                                   top_p=sampling.top_p, top_k=sampling.top_k or 0, max_tokens=sampling.max_new_tokens,
                                   stop=list(sampling.stop_strings) or None, logprobs=0, seed=sampling.seed + i,
                                   **engine_side)
                    for i in range(len(prompts))]

        def rlkit_rollout() -> int:
            batch = stages.rollout(s.generator, s.tokenizer, rows, sampling, s.policy.version, s.settings.rollout)
            return int(batch.completion_lengths.sum())

        def raw_generate(**engine_side) -> int:
            outputs = s.generator.llm.generate(prompts, params(**engine_side), use_tqdm=False)
            return sum(len(o.token_ids) for request in outputs for o in request.outputs)

        def raw_undecoded() -> int:  # what rlkit asks the engine for, without rlkit's decoding and tensors
            return raw_generate(detokenize=s.generator.engine_decodes(sampling), flat_logprobs=True)

        calls = (("rlkit", rlkit_rollout), ("vllm", raw_generate), ("vllm_undecoded", raw_undecoded))
        for _ in range(2):  # warm-up all
            counts = [call() for _, call in calls]
        rates: dict[str, list[float]] = {name: [] for name, _ in calls}
        per_cpu: dict[str, list[float]] = {name: [] for name, _ in calls}
        for i in range(args.rounds):
            for name, call in calls[::1 if i % 2 else -1]:
                t0, c0 = time.perf_counter(), time.process_time()
                tokens = call()
                rates[name].append(tokens / (time.perf_counter() - t0))
                per_cpu[name].append(tokens / (time.process_time() - c0))
        s.close()

    a, b, c = (statistics.median(rates[name]) for name, _ in calls)
    ca, cb, cc = (statistics.median(per_cpu[name]) for name, _ in calls)
    print(f"{len(prompts)} prompts x {g.num_generations_per_prompt} samples, up to {sampling.max_new_tokens} "
          f"new tokens, {args.rounds} alternating rounds")
    print(f"tokens per call: rlkit {counts[0]}, vLLM {counts[1]}, vLLM undecoded {counts[2]} (the same seeds: the "
          f"same tokens)")
    print(f"rlkit rollout stage:           median {a:9.0f} tokens/s, {ca:.0f} per CPU-second")
    print(f"raw vLLM generate (defaults):  median {b:9.0f} tokens/s, {cb:.0f} per CPU-second")
    print(f"raw vLLM, rlkit's engine side: median {c:9.0f} tokens/s, {cc:.0f} per CPU-second (no detokenizing, "
          f"flat logprobs: rlkit decodes the texts itself)")
    print(f"ratio rlkit / raw vLLM with its defaults: {a / b:.3f} (target >= 0.95); per CPU-second {ca / cb:.3f}")
    print(f"ratio rlkit / raw vLLM asked for the same: {a / c:.3f}; per CPU-second {ca / cc:.3f}")
    print(f"rollout_over_vllm={a / b:.3f} rollout_over_vllm_per_cpu_s={ca / cb:.3f} "
          f"rollout_over_vllm_undecoded={a / c:.3f} vllm_tokens_per_s={b:.0f}")

if __name__ == "__main__":
    main()
