"""rlkit against TRL's GRPOTrainer on the same work, one after the other in one run: CPU-seconds per step and
peak RSS, rlkit / TRL.

The same model folder, the same prompt/answer JSONL, group size, number of prompts, completion length and
learning rate on both sides; the KL penalty off; one update per batch; activations recomputed in backward on
both sides (TRL's GRPOConfig default ``gradient_checkpointing=True``; rlkit's Megatron full recompute, one layer
at a time; since 2026-12-03 evening, before which rlkit kept every activation); fp32, or with ``--bf16`` rlkit's
mixed precision (fp32 masters, bf16 compute copy and engine) against TRL's model loaded in bf16 (weights, gradients and
AdamW moments all bf16: cheaper, and it loses updates below bf16's resolution), and with ``--bf16 --pure-bf16``
rlkit in the same pure bf16 (``policy.optimizer.main_params_dtype=bfloat16``); one torch thread each
(``OMP_NUM_THREADS=1``). rlkit generates with vLLM in its process, TRL with transformers
(its default without vLLM). A random model generates to the length limit on both sides, so the work per
step is the same. CPU-seconds count every thread of the side's process over the steps after the warm-up, which
a shared, noisy machine disturbs less than wall time; the machine's load average is printed with them.

Shapes (``--shape``): ``tiny`` (the quickstart's ~0.8M-parameter Llama, its 16 x 8 workload), ``qwen3-0.6b``
(transformers' Qwen3Config with the published 0.6B values: hidden 1024, 28 layers, 16/8 heads, head_dim 128,
vocabulary 151,936, tied embeddings; random weights saved in bf16; the issue's 2 x 4 workload with 128 new
tokens) and ``qwen3-0.6b-4l`` (the same with 4 layers). Models and data go to a temporary folder.

``--lora R`` runs rlkit alone with rank-R adapters on every linear layer (bench/vs_trl_real.py runs adapters on
both sides) and reports its peak RSS per base parameter, the figure issue 29 bounds. ``--extra key=value ...``
adds rlkit overrides (e.g. ``policy.train_micro_batch_size=1``).

TRL runs in its own environment, bench/.venv-trl (``make bench-trl`` or scripts/setup-bench-trl.sh), never in
rlkit's lock. Usage: python bench/vs_trl.py [--shape tiny] [--steps 6] [--warmup 2] [--bf16 [--pure-bf16]]
[--lora R] [--extra K=V ...] [--rlkit-env NAME=VALUE ...]
Last line: ``rlkit/trl cpu_per_step=<x> peak_rss=<y>`` (with ``--lora``: ``rlkit lora bytes_per_param=<z>``).
"""

from __future__ import annotations

import os

os.environ["OMP_NUM_THREADS"] = "1"
os.environ.setdefault("HF_HUB_OFFLINE", "1")

import argparse  # noqa: E402
import json  # noqa: E402
import resource  # noqa: E402
import subprocess  # noqa: E402
import sys  # noqa: E402
import tempfile  # noqa: E402
import time  # noqa: E402
from pathlib import Path  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
TRL_PYTHON = ROOT / "bench" / ".venv-trl" / "bin" / "python"
# shape: (prompts per step, samples per prompt, new tokens, learning rate)
WORKLOADS = {"tiny": (16, 8, 8, 1e-4), "qwen3-0.6b": (2, 4, 128, 1e-6), "qwen3-0.6b-4l": (2, 4, 128, 1e-6)}
QWEN3_06B = dict(hidden_size=1024, intermediate_size=3072, num_hidden_layers=28, num_attention_heads=16,
                 num_key_value_heads=8, head_dim=128, vocab_size=151936, tie_word_embeddings=True,
                 max_position_embeddings=40960, rope_theta=1_000_000.0, rms_norm_eps=1e-6)


def make_workload(shape: str, folder: Path) -> tuple[Path, Path]:
    """The model folder and a JSONL of 3-digit addition rows (prompt, answer) for ``shape``."""
    import torch
    from transformers import Qwen3Config, Qwen3ForCausalLM

    from rlkit.envs.arithmetic import iter_arithmetic_rows
    from rlkit.models import make_model
    from rlkit.models.tokenizer import build_char_tokenizer

    model = folder / "model"
    if shape == "tiny":
        make_model(model, "tiny", "llama", seed=0)
    else:
        config = Qwen3Config(**{**QWEN3_06B, "num_hidden_layers": 4 if shape.endswith("-4l") else 28})
        torch.manual_seed(0)
        torch.set_default_dtype(torch.bfloat16)  # made in bf16 directly: 1.2 GB, not 2.4 GB then a cast
        Qwen3ForCausalLM(config).save_pretrained(model)
        torch.set_default_dtype(torch.float32)
        build_char_tokenizer().save_pretrained(model)
    rows = iter_arithmetic_rows(3, seed=0)
    data = folder / "data.jsonl"
    data.write_text("".join(json.dumps(next(rows)) + "\n" for _ in range(4000)))
    return model, data


def rlkit_side(args) -> dict:
    """rlkit's Session on the workload, in this process (called through a subprocess of this file)."""
    import torch

    torch.set_num_threads(1)
    import yaml

    import rlkit

    prompts, generations, new_tokens, lr = WORKLOADS[args.shape]
    s = rlkit.Session.from_config("quickstart", {
        "policy.model_name": args.model, "policy.model_preset": None, "data.task": None, "data.path": args.data,
        "sft.enabled": False, "grpo.use_dynamic_sampling": False, "grpo.num_prompts_per_step": prompts,
        "grpo.num_generations_per_prompt": generations, "policy.generation.max_new_tokens": new_tokens,
        "policy.max_total_sequence_length": 32 + new_tokens, "policy.optimizer.lr": lr,
        "policy.train_micro_batch_size": prompts * generations, "policy.logprob_batch_size": prompts * generations,
        "policy.precision": "bfloat16" if args.bf16 else "float32",
        "policy.generation.vllm_cfg.precision": "bfloat16" if args.bf16 else "float32",  # TRL generates with its model
        "policy.generation.vllm_cfg.kv_cache_space_gib": "auto",  # what the 2 x 4 or 16 x 8 batch needs
        **({"policy.optimizer.main_params_dtype": "bfloat16"} if args.pure_bf16 else {}),
        # TRL's GRPOConfig checkpoints activations by default (gradient_checkpointing=True): the same here
        "policy.megatron_cfg.recompute_granularity": "full", "policy.megatron_cfg.recompute_method": "uniform",
        "policy.megatron_cfg.recompute_num_layers": 1,
        **({"policy.lora_cfg.enabled": True, "policy.lora_cfg.dim": args.lora} if args.lora else {}),
        **{key: yaml.safe_load(value) for key, value in (item.split("=", 1) for item in args.extra)}})
    marks = []
    for _ in range(args.warmup + args.steps):
        s.step()
        marks.append((time.process_time(), time.perf_counter()))
    s.close()
    (c0, w0), (c1, w1) = marks[args.warmup - 1], marks[-1]
    return {"side": "rlkit", "cpu_s_per_step": (c1 - c0) / args.steps, "wall_s_per_step": (w1 - w0) / args.steps,
            "peak_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
            "threads": torch.get_num_threads(), "steps": len(marks)}


def run_side(command: list[str], env: dict[str, str] | None = None) -> dict:
    """Run one side in a fresh process (``env``: variables for it alone); its last stdout line is its JSON result."""
    done = subprocess.run(command, capture_output=True, text=True, cwd=ROOT,
                          env={**os.environ, "OMP_NUM_THREADS": "1", "VLLM_ENABLE_V1_MULTIPROCESSING": "0",
                               **(env or {})})
    lines = [line for line in done.stdout.splitlines() if line.startswith("{")]
    if done.returncode != 0 or not lines:
        raise SystemExit(f"{command[1]} failed ({done.returncode}):\n{done.stderr[-3000:]}")
    return json.loads(lines[-1])


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--shape", choices=sorted(WORKLOADS), default="tiny")
    parser.add_argument("--steps", type=int, default=6)
    parser.add_argument("--warmup", type=int, default=2)
    parser.add_argument("--bf16", action="store_true", help="train in bf16 on both sides (rlkit: policy.precision)")
    parser.add_argument("--pure-bf16", action="store_true", help="with --bf16: rlkit in pure bf16 as TRL (no masters)")
    parser.add_argument("--lora", type=int, default=0, help="rlkit alone, with adapters of this rank on every linear")
    parser.add_argument("--extra", nargs="*", default=[], help="more rlkit overrides, key=value (rlkit alone)")
    parser.add_argument("--rlkit-env", nargs="*", default=[], metavar="NAME=VALUE",
                        help="variables for rlkit's process alone, e.g. GLIBC_TUNABLES=glibc.malloc.hugetlb=1")
    parser.add_argument("--side", choices=["rlkit"], help=argparse.SUPPRESS)
    parser.add_argument("--model", help=argparse.SUPPRESS)
    parser.add_argument("--data", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.side == "rlkit":
        print(json.dumps(rlkit_side(args)))
        return
    if not TRL_PYTHON.exists():
        raise SystemExit(f"TRL's environment is missing ({TRL_PYTHON}): run `make bench-trl` first")
    prompts, generations, new_tokens, lr = WORKLOADS[args.shape]
    with tempfile.TemporaryDirectory() as tmp:
        model, data = make_workload(args.shape, Path(tmp))
        common = ["--steps", str(args.steps), "--warmup", str(args.warmup)] + (["--bf16"] if args.bf16 else [])
        ours_only = ["--pure-bf16"] if args.pure_bf16 else []
        from rlkit.models.factory import count_parameters

        params = count_parameters(model)
        load = [os.getloadavg()[0]]
        ours = run_side([sys.executable, __file__, "--side", "rlkit", "--shape", args.shape, "--model", str(model),
                         "--data", str(data), "--lora", str(args.lora), *common, *ours_only, "--extra", *args.extra],
                        dict(item.split("=", 1) for item in args.rlkit_env))
        load.append(os.getloadavg()[0])
        if args.lora:
            print(f"shape {args.shape} ({params / 1e6:.0f}M parameters; {prompts} x {generations}, {new_tokens} new "
                  f"tokens, {'bf16' if args.bf16 else 'fp32'}), rank-{args.lora} adapters on every linear layer, "
                  f"{args.steps} steps after {args.warmup} warm-up, 1 thread; "
                  f"load average {min(load):.1f}-{max(load):.1f}")
            print(f"rlkit: {ours['cpu_s_per_step']:.3f} CPU-s/step, peak RSS {ours['peak_rss_mb']:.0f} MB")
            print(f"rlkit lora bytes_per_param={ours['peak_rss_mb'] * 2**20 / params:.2f}")
            return
        theirs = run_side([str(TRL_PYTHON), str(ROOT / "bench" / "trl_grpo_side.py"), str(model), str(data),
                           "--prompts", str(prompts), "--generations", str(generations), "--max-new-tokens",
                           str(new_tokens), "--lr", str(lr), *common])
        load.append(os.getloadavg()[0])
    precision = ("pure bf16" if args.pure_bf16 else "bf16 with fp32 masters") if args.bf16 else "fp32"
    print(f"shape {args.shape} ({prompts} prompts x {generations} samples, {new_tokens} new tokens, "
          f"{precision}), {args.steps} steps after {args.warmup} warm-up, 1 thread each; "
          f"load average {min(load):.1f}-{max(load):.1f}")
    if args.extra or args.rlkit_env:
        print("rlkit with:", " ".join(args.extra + args.rlkit_env))
    print(f"{'side':<8}{'CPU s/step':>12}{'wall s/step':>13}{'peak RSS MB':>13}")
    for r in (ours, theirs):
        print(f"{r['side']:<8}{r['cpu_s_per_step']:>12.3f}{r['wall_s_per_step']:>13.3f}{r['peak_rss_mb']:>13.0f}")
    print(f"bytes per parameter ({params / 1e6:.0f}M): rlkit {ours['peak_rss_mb'] * 2**20 / params:.1f}, "
          f"TRL {theirs['peak_rss_mb'] * 2**20 / params:.1f}")
    print(f"rlkit/trl cpu_per_step={ours['cpu_s_per_step'] / theirs['cpu_s_per_step']:.2f} "
          f"peak_rss={ours['peak_rss_mb'] / theirs['peak_rss_mb']:.2f}")


if __name__ == "__main__":
    main()
