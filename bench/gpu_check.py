"""GPU check: the Megatron and DTensor policies in bf16 on ~1B random Llama and Qwen3 models, one script.

For one CUDA GPU (made for an H200: PyTorch, transformers, no vLLM, no network); besides those it needs
megatron-core, pydantic (+ pydantic-core, annotated-types, typing-inspection) and datasets (+ dill,
multiprocess), which ``import rlkit`` pulls in, installed or carried as wheels. For each model
family it writes a random-init HF folder (hidden 2048, 18 layers, 16 heads / 8 KV heads of 128, ffn 5632,
vocabulary 32000, untied: ~0.98B parameters), then

1. the bf16-vs-fp32 logprob gap: each policy at ``policy.precision=bfloat16`` against transformers' model in
   fp32 on the same weights (an independent forward), max and mean over the valid tokens of a batch;
2. training: both policies resident, one full optimizer step each in turn on the same batch (alternating
   Megatron, DTensor, Megatron, ...; medians after warm-up): step time, tokens/s, MFU and peak memory
   allocated during the step (both policies' weights and optimizer state are resident throughout).

MFU = (6 N + 12 L d s) x tokens / step time / peak FLOP/s (PaLM's estimate with attention: N parameters,
L layers, hidden d, sequence s), against the datasheet's dense bf16 peak (``--peak-tflops``, 989 for an
H100/H200 SXM) and against an 8192^3 bf16 matmul measured at the start. A backend that fails is reported
and the rest still runs; every figure goes to one JSON file (``--out``) and a short table.

On the CPU the same code runs at a tiny size (``--tiny``; the default suite's smoke test):
    python bench/gpu_check.py --tiny --out /tmp/gpu_check.json
On a GPU:  python bench/gpu_check.py --out gpu_check.json   (~3-5 min on an H200, budget 8)
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import statistics
import sys
import tempfile
import time
import traceback
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run from a checkout without installing

FULL = dict(hidden=2048, layers=18, heads=16, kv_heads=8, ffn=5632, vocab=32000)
TINY = dict(hidden=64, layers=2, heads=2, kv_heads=1, ffn=192, vocab=128)
BACKENDS = ("megatron", "dtensor")


def parse_args(argv=None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tiny", action="store_true", help="tiny models and batch: the CPU smoke run")
    parser.add_argument("--families", default="llama,qwen3")
    parser.add_argument("--batch", type=int, default=8, help="sequences per optimizer step")
    parser.add_argument("--seq", type=int, default=2048, help="tokens per sequence")
    parser.add_argument("--micro-batch", type=int, default=2)
    parser.add_argument("--steps", type=int, default=5, help="timed steps per backend")
    parser.add_argument("--warmup", type=int, default=2)
    parser.add_argument("--peak-tflops", type=float, default=989.0, help="datasheet dense bf16 TFLOP/s of the GPU")
    parser.add_argument("--budget-s", type=float, default=420.0, help="stop timing new steps after this long")
    parser.add_argument("--profile", action="store_true",
                        help="after the timed steps, one more step per backend under torch.profiler: its top kernels")
    parser.add_argument("--out", default="gpu_check.json")
    args = parser.parse_args(argv)
    if args.tiny:
        args.batch, args.seq, args.micro_batch = min(args.batch, 4), min(args.seq, 32), min(args.micro_batch, 2)
    return args


def single_process_group_env() -> None:
    """One rank through env:// so the policies use NCCL on a GPU (gloo otherwise)."""
    if torch.cuda.is_available() and "RANK" not in os.environ:
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        os.environ.update(RANK="0", WORLD_SIZE="1", LOCAL_RANK="0", MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))


def sync() -> None:
    if torch.cuda.is_available():
        torch.cuda.synchronize()


def measured_matmul_tflops() -> float | None:
    """bf16 8192^3 matmul TFLOP/s on this GPU (mean of 10 after 3 warm-ups); None on a CPU."""
    if not torch.cuda.is_available():
        return None
    a, b = (torch.randn(8192, 8192, device="cuda", dtype=torch.bfloat16) for _ in range(2))
    for _ in range(3):
        a @ b
    sync()
    t0 = time.perf_counter()
    for _ in range(10):
        a @ b
    sync()
    return 2 * 8192**3 * 10 / (time.perf_counter() - t0) / 1e12


def make_batch(batch: int, seq: int, vocab: int):
    """Random tokens, every row full length; the first quarter is the prompt (not in the loss)."""
    from rlkit.trajectories import Trajectories

    g = torch.Generator().manual_seed(0)
    ids = torch.randint(3, vocab, (batch, seq), generator=g)
    attention = torch.ones(batch, seq, dtype=torch.bool)
    loss_mask = attention.clone()
    loss_mask[:, : seq // 4] = False
    return Trajectories(prompts=("",) * batch, completions=("",) * batch, input_ids=ids, attention_mask=attention,
                        loss_mask=loss_mask, generator_logprobs=torch.zeros(batch, seq),
                        finish_reasons=("stop",) * batch, group_size=1, policy_version=0)


def fp32_reference_logprobs(folder: str, batch) -> torch.Tensor:
    """transformers' fp32 forward on the same weights: token logprobs [B, T] (position 0: 0)."""
    from transformers import AutoModelForCausalLM

    device = "cuda" if torch.cuda.is_available() else "cpu"
    model = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32, attn_implementation="sdpa").to(device)
    with torch.no_grad():
        logits = model(input_ids=batch.input_ids.to(device), use_cache=False).logits
        token = torch.log_softmax(logits[:, :-1].float(), -1).gather(-1, batch.input_ids[:, 1:, None].to(device))
    del model, logits
    if torch.cuda.is_available():
        torch.cuda.empty_cache()
    return torch.nn.functional.pad(token.squeeze(-1).cpu(), (1, 0))


def build_policy(backend: str, folder: str, args):
    from rlkit.config.components import PolicyConfig
    from rlkit.policy.factory import in_process_policy

    cfg = PolicyConfig(model_name=folder, precision="bfloat16", train_micro_batch_size=args.micro_batch,
                       logprob_batch_size=args.micro_batch, max_total_sequence_length=args.seq,
                       megatron_cfg={"enabled": backend == "megatron"}, dtensor_cfg={"enabled": backend == "dtensor"})
    return in_process_policy(cfg)


def profile_step(policy, batch) -> str:
    """One train step under torch.profiler: the 20 operators with the most device (else host) time of their own."""
    from torch.profiler import ProfilerActivity, profile
    from rlkit.stages.sft import nll_loss

    cuda = torch.cuda.is_available()
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if cuda else [])
    with profile(activities=activities) as prof:
        policy.train_step(batch, nll_loss)
        sync()
    key = "self_cuda_time_total" if cuda else "self_cpu_time_total"
    return prof.key_averages().table(sort_by=key, row_limit=20)


def check_family(family: str, shape: dict, args, workdir: str, started: float) -> dict:
    from rlkit.models import make_model
    from rlkit.models.factory import TinyModelSpec, count_parameters
    from rlkit.stages.sft import nll_loss

    out: dict = {"family": family, "errors": {}}
    t0 = time.perf_counter()
    spec = TinyModelSpec(shape["hidden"], shape["layers"], shape["heads"], shape["kv_heads"], shape["ffn"],
                         vocab_size=shape["vocab"], max_position_embeddings=max(args.seq, 512))
    folder = str(make_model(f"{workdir}/{family}", spec, family, seed=0))
    out["parameters"] = n = count_parameters(folder)
    out["make_model_s"] = round(time.perf_counter() - t0, 1)
    batch = make_batch(args.batch, args.seq, shape["vocab"])
    gap_rows = batch.select(slice(0, min(2, args.batch)))
    reference = fp32_reference_logprobs(folder, gap_rows)

    policies = {}
    for backend in BACKENDS:
        try:
            before = torch.cuda.memory_allocated() if torch.cuda.is_available() else 0
            t0 = time.perf_counter()
            policies[backend] = build_policy(backend, folder, args)
            out[f"{backend}_build_s"] = round(time.perf_counter() - t0, 1)
            if torch.cuda.is_available():
                out[f"{backend}_resident_gib"] = round((torch.cuda.memory_allocated() - before) / 2**30, 2)
            scores = policies[backend].logprobs(gap_rows.input_ids, gap_rows.attention_mask).logprobs
            gap = (scores - reference).abs()[:, 1:]
            out[f"{backend}_bf16_vs_fp32_logprob_gap"] = {"max": gap.max().item(), "mean": gap.mean().item()}
        except Exception:
            out["errors"][backend] = traceback.format_exc(limit=6)
            policies.pop(backend, None)

    times: dict[str, list[float]] = {b: [] for b in policies}
    peaks: dict[str, float] = {}
    for i in range(args.warmup + args.steps):
        if time.perf_counter() - started > args.budget_s and all(times[b] for b in policies):
            out["stopped_early"] = f"time budget {args.budget_s:.0f}s reached after {i} rounds"
            break
        for backend in list(policies):
            try:
                if torch.cuda.is_available():
                    torch.cuda.reset_peak_memory_stats()
                sync()
                t0 = time.perf_counter()
                policies[backend].train_step(batch, nll_loss)
                sync()
            except Exception:
                out["errors"][backend] = traceback.format_exc(limit=6)
                policies.pop(backend).close()
                continue
            if i >= args.warmup:
                times[backend].append(time.perf_counter() - t0)
            if torch.cuda.is_available():
                peaks[backend] = max(peaks.get(backend, 0.0), torch.cuda.max_memory_allocated() / 2**30)
    if args.profile:
        for backend, policy in policies.items():
            out[f"{backend}_profile"] = profile_step(policy, batch)
    for policy in policies.values():
        policy.close()
    if torch.cuda.is_available():
        torch.cuda.empty_cache()

    tokens = args.batch * args.seq
    flops_per_token = 6 * n + 12 * shape["layers"] * shape["hidden"] * args.seq
    for backend, ts in times.items():
        if not ts:
            continue
        step = statistics.median(ts)
        achieved = flops_per_token * tokens / step / 1e12
        out[backend] = {"step_s": step, "steps": len(ts), "tokens_per_s": tokens / step, "tflops": achieved,
                        "mfu": achieved / args.peak_tflops, "peak_gib": peaks.get(backend)}
        if args.measured_tflops:
            out[backend]["mfu_of_measured_matmul"] = achieved / args.measured_tflops
    if all(b in out for b in BACKENDS):
        out["megatron_over_dtensor_step_time"] = out["megatron"]["step_s"] / out["dtensor"]["step_s"]
    return out


def table(result: dict) -> str:
    lines = [f"{result['device']}; bf16 (fp32 master weights); batch {result['batch']} x {result['seq']} tokens, "
             f"micro-batch {result['micro_batch']}; MFU against {result['peak_tflops']:g} TFLOP/s"
             + (f" (measured matmul {result['measured_tflops']:.0f})" if result["measured_tflops"] else ""),
             f"{'model':7s} {'backend':9s} {'step s':>8s} {'tok/s':>10s} {'MFU':>6s} {'peak GiB':>9s} "
             f"{'gap max':>8s} {'gap mean':>9s}"]
    for fam in result["families"]:
        for backend in BACKENDS:
            row, gap = fam.get(backend), fam.get(f"{backend}_bf16_vs_fp32_logprob_gap", {})
            if row is None:
                lines.append(f"{fam['family']:7s} {backend:9s} FAILED (see errors in the JSON)")
                continue
            peak = f"{row['peak_gib']:.1f}" if row["peak_gib"] is not None else "-"
            lines.append(f"{fam['family']:7s} {backend:9s} {row['step_s']:8.3f} {row['tokens_per_s']:10,.0f} "
                         f"{row['mfu']:6.1%} {peak:>9s} {gap.get('max', float('nan')):8.4f} "
                         f"{gap.get('mean', float('nan')):9.5f}")
        if "megatron_over_dtensor_step_time" in fam:
            lines.append(f"{fam['family']:7s} Megatron / DTensor step time: {fam['megatron_over_dtensor_step_time']:.3f}")
    lines.append(f"total {result['total_s']:.0f}s")
    return "\n".join(lines)


def main(argv=None) -> dict:
    started = time.perf_counter()
    args = parse_args(argv)
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    single_process_group_env()
    args.measured_tflops = measured_matmul_tflops()
    shape = TINY if args.tiny else FULL
    result = {"date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
              "device": torch.cuda.get_device_name() if torch.cuda.is_available() else "cpu (smoke run: no figure "
              "here means anything on a GPU)", "torch": torch.__version__, "batch": args.batch, "seq": args.seq,
              "micro_batch": args.micro_batch, "peak_tflops": args.peak_tflops,
              "measured_tflops": args.measured_tflops, "shape": shape, "families": []}
    with tempfile.TemporaryDirectory() as workdir:
        for family in args.families.split(","):
            print(f"== {family}", flush=True)
            result["families"].append(check_family(family, shape, args, workdir, started))
            Path(args.out).write_text(json.dumps(result, indent=1))  # what finished survives a later failure
    result["total_s"] = time.perf_counter() - started
    Path(args.out).write_text(json.dumps(result, indent=1))
    print(table(result))
    for fam in result["families"]:
        for key in (k for k in fam if k.endswith("_profile")):
            print(f"{fam['family']} {key}:\n{fam[key]}")
        for backend, trace in fam["errors"].items():
            print(f"{fam['family']} {backend} FAILED:\n{trace}")
    return result


if __name__ == "__main__":
    main()
