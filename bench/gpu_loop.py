"""GPU loop: the whole GRPO step, stage by stage as a notebook calls it, on one GPU with the Megatron policy and the
Megatron generator on the policy's own weights (no vLLM, no network), then the same steps with transformers'
generator for comparison.

For one CUDA GPU (an H100/H200: PyTorch, transformers, megatron-core and rlkit's pure-Python dependencies; no vLLM).
It writes a random-init Llama HF folder (hidden 1536, 16 layers, 12 heads / 4 KV heads of 128, ffn 4096, vocabulary
32000: ~0.6B parameters; ``--tiny``: a few thousand) and runs the quickstart task on it (3-digit sums in chat form;
the random model earns no reward, which does not change what each stage costs) with ``policy.precision=bfloat16``
(fp32 on the CPU), no SFT, no dynamic sampling. Per generator, ``--steps`` steps of

    rollout -> score -> logprobs -> advantages -> train -> refit

each a separate call timed on its own (the device synchronised around it), and per step: the generated tokens and
generation tokens/s, the train step's MFU ((6 N + 12 L d s) x tokens / seconds / peak, PaLM's estimate), the
generator-vs-trainer logprob mismatch on the sampled tokens (max and mean |difference|), and the peak memory
allocated. The first step is warm-up (reported, left out of the medians). One JSON (``--out``) and a table.

On the CPU the same code runs at a tiny size (``--device cpu`` or ``--tiny``; the default suite's smoke test):
    python bench/gpu_loop.py --device cpu --steps 2 --out /tmp/gpu_loop.json
On a GPU:  python bench/gpu_loop.py --out gpu_loop.json   (budget: under 8 minutes of device time)
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
import traceback
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run from a checkout without installing

FULL = dict(hidden=1536, layers=16, heads=12, kv_heads=4, ffn=4096, vocab=32000)
TINY = dict(hidden=64, layers=2, heads=2, kv_heads=1, ffn=192, vocab=128)
STAGES = ("rollout", "score", "logprobs", "advantages", "train", "refit")


def parse_args(argv=None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tiny", action="store_true", help="a tiny model and batch: the CPU smoke run")
    parser.add_argument("--device", choices=("auto", "cpu"), default="auto",
                        help="cpu: the tiny run on the CPU even where a GPU is visible")
    parser.add_argument("--steps", type=int, default=10, help="GRPO steps per generator (the first is warm-up)")
    parser.add_argument("--prompts", type=int, default=16, help="prompts per step")
    parser.add_argument("--samples", type=int, default=8, help="samples per prompt")
    parser.add_argument("--new-tokens", type=int, default=128, help="max new tokens per sample")
    parser.add_argument("--generators", default="megatron,hf", help="policy.generation.backend values, in order")
    parser.add_argument("--peak-tflops", type=float, default=989.0, help="datasheet dense bf16 TFLOP/s of the GPU")
    parser.add_argument("--budget-s", type=float, default=420.0, help="stop starting new steps after this long")
    parser.add_argument("--out", default="gpu_loop.json")
    args = parser.parse_args(argv)
    args.tiny = args.tiny or args.device == "cpu"
    if args.tiny:
        args.prompts, args.samples = min(args.prompts, 2), min(args.samples, 2)
        args.new_tokens = min(args.new_tokens, 6)
    return args


def sync() -> None:
    if torch.cuda.is_available():
        torch.cuda.synchronize()


def timed(fn, *args):
    """fn(*args) with the device synchronised before and after: (its result, seconds)."""
    sync()
    t0 = time.perf_counter()
    out = fn(*args)
    sync()
    return out, time.perf_counter() - t0


def make_folder(workdir: str, shape: dict) -> tuple[str, int]:
    from rlkit.models import make_model
    from rlkit.models.factory import TinyModelSpec, count_parameters

    spec = TinyModelSpec(shape["hidden"], shape["layers"], shape["heads"], shape["kv_heads"], shape["ffn"],
                         vocab_size=shape["vocab"], max_position_embeddings=1024)
    folder = str(make_model(f"{workdir}/llama", spec, "llama", seed=0))
    return folder, count_parameters(folder)


def session_overrides(folder: str, generator: str, args, workdir: str) -> dict:
    return {"policy.model_name": folder, "policy.model_preset": None, "sft.enabled": False,
            "policy.precision": "bfloat16" if torch.cuda.is_available() else "float32",
            "policy.generation.backend": generator, "policy.generation.max_new_tokens": args.new_tokens,
            "policy.max_total_sequence_length": 64 + args.new_tokens,
            "grpo.num_prompts_per_step": args.prompts, "grpo.num_generations_per_prompt": args.samples,
            "grpo.use_dynamic_sampling": False, "logger.log_dir": f"{workdir}/runs-{generator}",
            "policy.train_micro_batch_size": min(8, args.prompts * args.samples)}


def loop(generator: str, folder: str, n: int, shape: dict, args, workdir: str, started: float) -> dict:
    """``args.steps`` steps through the stages, one call each: per-step figures and their medians."""
    import rlkit

    out: dict = {"generator": generator, "steps": []}
    if torch.cuda.is_available():
        torch.cuda.reset_peak_memory_stats()
    s, seconds = timed(rlkit.Session.from_config, "quickstart", session_overrides(folder, generator, args, workdir))
    out["session_start_s"] = seconds
    try:
        for i in range(args.steps):
            if i > 1 and time.perf_counter() - started > args.budget_s:
                out["stopped_early"] = f"time budget {args.budget_s:.0f}s reached after {i} steps"
                break
            step: dict = {}
            batch, step["rollout"] = timed(s.rollout)
            batch, step["score"] = timed(s.score, batch)
            batch, step["logprobs"] = timed(s.logprobs, batch)
            batch, step["advantages"] = timed(s.advantages, batch)
            _, step["train"] = timed(s.train, batch)
            _, step["refit"] = timed(s.refit)
            mask = batch.loss_mask
            tokens = int(mask.sum())
            gap = (batch.generator_logprobs - batch.prev_logprobs)[mask].abs()
            seq = batch.input_ids.shape[1]
            train_flops = (6 * n + 12 * shape["layers"] * shape["hidden"] * seq) * batch.batch_size * seq
            step.update(generated_tokens=tokens, generation_tokens_per_s=tokens / step["rollout"],
                        train_mfu=train_flops / step["train"] / 1e12 / args.peak_tflops,
                        mismatch_max=float(gap.max()), mismatch_mean=float(gap.mean()),
                        step_s=sum(step[k] for k in STAGES))
            out["steps"].append(step)
            print(f"{generator} step {i}: " + " ".join(f"{k} {step[k]:.3f}s" for k in STAGES)
                  + f" | {step['generation_tokens_per_s']:.0f} tok/s, mismatch max {step['mismatch_max']:.2e}",
                  flush=True)
    finally:
        s.close()
    timed_steps = out["steps"][1:] or out["steps"]
    out["median"] = {k: statistics.median(st[k] for st in timed_steps)
                     for k in (*STAGES, "step_s", "generation_tokens_per_s", "train_mfu")}
    out["mismatch_max"] = max(st["mismatch_max"] for st in out["steps"])
    out["peak_gib"] = torch.cuda.max_memory_allocated() / 2**30 if torch.cuda.is_available() else None
    return out


def table(result: dict) -> str:
    lines = [f"{result['device']}; {result['parameters'] / 1e6:.1f}M-parameter Llama, {result['precision']}; "
             f"{result['prompts']} prompts x {result['samples']} samples, {result['new_tokens']} new tokens; medians "
             "after the first step",
             f"{'generator':10s} " + " ".join(f"{k:>10s}" for k in STAGES)
             + f" {'step s':>8s} {'gen tok/s':>10s} {'MFU':>6s} {'mismatch':>9s} {'peak GiB':>9s}"]
    for run in result["runs"]:
        if "median" not in run:
            lines.append(f"{run['generator']:10s} FAILED (see the JSON)")
            continue
        m, peak = run["median"], run["peak_gib"]
        lines.append(f"{run['generator']:10s} " + " ".join(f"{m[k]:10.3f}" for k in STAGES)
                     + f" {m['step_s']:8.3f} {m['generation_tokens_per_s']:10,.0f} {m['train_mfu']:6.1%}"
                     f" {run['mismatch_max']:9.2e} {peak if peak is None else round(peak, 1)!s:>9s}")
    done = {r["generator"]: r for r in result["runs"] if "median" in r}
    if "megatron" in done and "hf" in done:
        ratio = done["megatron"]["median"]["rollout"] / done["hf"]["median"]["rollout"]
        lines.append(f"rollout time, Megatron generator / transformers generate: {ratio:.3f}")
    lines.append(f"total {result['total_s']:.0f}s")
    return "\n".join(lines)


def main(argv=None) -> dict:
    started = time.perf_counter()
    args = parse_args(argv)
    if args.device == "cpu" and torch.cuda.is_available():  # CUDA hidden before anything initialises it
        os.execve(sys.executable, [sys.executable, __file__, *(sys.argv[1:] if argv is None else argv)],
                  {**os.environ, "CUDA_VISIBLE_DEVICES": ""})
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("WANDB_MODE", "offline")
    shape = TINY if args.tiny else FULL
    result = {"date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
              "device": torch.cuda.get_device_name() if torch.cuda.is_available() else "cpu (smoke run: no figure "
              "here means anything on a GPU)", "torch": torch.__version__, "shape": shape,
              "precision": "bfloat16" if torch.cuda.is_available() else "float32", "prompts": args.prompts,
              "samples": args.samples, "new_tokens": args.new_tokens, "runs": []}
    with tempfile.TemporaryDirectory() as workdir:
        folder, result["parameters"] = make_folder(workdir, shape)
        for generator in args.generators.split(","):
            print(f"== {generator}", flush=True)
            try:
                result["runs"].append(loop(generator, folder, result["parameters"], shape, args, workdir, started))
            except Exception:
                result["runs"].append({"generator": generator, "error": traceback.format_exc(limit=8)})
            Path(args.out).write_text(json.dumps(result, indent=1))  # what finished survives a later failure
    result["total_s"] = time.perf_counter() - started
    Path(args.out).write_text(json.dumps(result, indent=1))
    print(table(result))
    for run in result["runs"]:
        if "error" in run:
            print(f"{run['generator']} FAILED:\n{run['error']}")
    return result


if __name__ == "__main__":
    main()
