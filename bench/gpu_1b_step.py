"""GPU benchmark: training step time and model FLOP utilisation of both policy backends on a ~1B Llama, bf16.

For a machine with one CUDA GPU; needs neither vLLM nor a network (the model is random-init and written to a
temporary folder). Builds a Llama-style HF folder (default hidden 2048, 18 layers, 16 heads / 8 KV heads,
ffn 5632, vocabulary 32000, untied: ~0.98B parameters), loads it into the Megatron-Core policy and the
DTensor/FSDP2 policy with bf16 weights, gradients and AdamW state, and times full optimizer steps on the
same batch, alternating the backends; medians after warm-up. Reports

    MFU = 6 * parameters * tokens per step / step time / peak FLOP/s

(the usual dense estimate: attention's s^2 term is left out), with the peak given by ``--peak-tflops``
(default 989: H200 / H100 SXM bf16 dense). A backend that fails is reported and the other still runs.

On the CPU, ``--help`` works, and a tiny smoke run checks the code path:
    python bench/gpu_1b_step.py --hidden 128 --layers 2 --heads 4 --kv-heads 2 --ffn 384 --vocab 128 \
        --batch 2 --seq 64 --micro-batch 1 --steps 1 --warmup 0 --dtype float32
Usage on a GPU: python bench/gpu_1b_step.py [--batch 8 --seq 2048 --micro-batch 4 --steps 5]
"""

from __future__ import annotations

import argparse
import os
import socket
import statistics
import tempfile
import time
import traceback

import torch

DTYPES = {"bfloat16": torch.bfloat16, "float32": torch.float32}


def parse_args(argv=None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    shape = parser.add_argument_group("model (defaults: ~0.98B-parameter Llama)")
    shape.add_argument("--hidden", type=int, default=2048)
    shape.add_argument("--layers", type=int, default=18)
    shape.add_argument("--heads", type=int, default=16)
    shape.add_argument("--kv-heads", type=int, default=8)
    shape.add_argument("--ffn", type=int, default=5632)
    shape.add_argument("--vocab", type=int, default=32000)
    run = parser.add_argument_group("run")
    run.add_argument("--batch", type=int, default=8, help="sequences per optimizer step")
    run.add_argument("--seq", type=int, default=2048, help="tokens per sequence")
    run.add_argument("--micro-batch", type=int, default=4)
    run.add_argument("--steps", type=int, default=5)
    run.add_argument("--warmup", type=int, default=2)
    run.add_argument("--dtype", choices=sorted(DTYPES), default="bfloat16")
    run.add_argument("--peak-tflops", type=float, default=989.0, help="peak dense TFLOP/s of one GPU at --dtype")
    run.add_argument("--backends", default="megatron,dtensor", help="comma-separated: megatron, dtensor")
    run.add_argument("--model-dir", default=None, help="reuse or create the HF folder here (default: a temp dir)")
    return parser.parse_args(argv)


def single_process_group_env() -> None:
    """One rank through env:// so the policies pick NCCL on a GPU (gloo otherwise)."""
    if torch.cuda.is_available() and "RANK" not in os.environ:
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        os.environ.update(RANK="0", WORLD_SIZE="1", LOCAL_RANK="0", MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))


def make_megatron(cfg, dtype: torch.dtype):
    """The Megatron policy with its weights cast to ``dtype``."""
    from rlkit.policy.megatron.policy import MegatronPolicy

    policy = MegatronPolicy(cfg)
    policy.model.to(dtype)
    policy.reset_optimizer(cfg.optimizer, cfg.scheduler)
    policy.reference_state = None  # not used here; frees a copy of the weights
    return policy


def make_dtensor(cfg, dtype: torch.dtype):
    from rlkit.config.components import DTensorConfig, MegatronConfig
    from rlkit.policy.dtensor import DTensorPolicy

    cfg = cfg.model_copy(update={"megatron_cfg": MegatronConfig(enabled=False), "dtensor_cfg": DTensorConfig(enabled=True)})
    policy = DTensorPolicy(cfg, param_dtype=dtype)
    policy.reference_state = None
    return policy


def make_batch(batch: int, seq: int, vocab: int, device: torch.device):
    from rlkit.trajectories import Trajectories

    g = torch.Generator().manual_seed(0)
    ids = torch.randint(3, vocab, (batch, seq), generator=g)
    attention = torch.ones(batch, seq, dtype=torch.bool)
    loss_mask = attention.clone()
    loss_mask[:, : seq // 4] = False
    return Trajectories(prompts=("",) * batch, completions=("",) * batch, input_ids=ids.to(device),
                        attention_mask=attention.to(device), loss_mask=loss_mask.to(device),
                        generator_logprobs=torch.zeros(batch, seq, device=device),
                        finish_reasons=("stop",) * batch, group_size=1, policy_version=0)


def sync() -> None:
    if torch.cuda.is_available():
        torch.cuda.synchronize()


def main(argv=None) -> None:
    args = parse_args(argv)
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    from rlkit.config.components import PolicyConfig
    from rlkit.models import make_model
    from rlkit.models.factory import TinyModelSpec, count_parameters
    from rlkit.stages.sft import nll_loss

    dtype = DTYPES[args.dtype]
    device = torch.device("cuda") if torch.cuda.is_available() else torch.device("cpu")
    single_process_group_env()
    spec = TinyModelSpec(args.hidden, args.layers, args.heads, args.kv_heads, args.ffn, vocab_size=args.vocab,
                         max_position_embeddings=max(args.seq, 512))
    with tempfile.TemporaryDirectory() as tmp:
        folder = args.model_dir or f"{tmp}/model"
        if not os.path.isfile(os.path.join(folder, "config.json")):
            t0 = time.perf_counter()
            make_model(folder, spec, "llama", seed=0)
            print(f"made {folder} in {time.perf_counter() - t0:.0f}s", flush=True)
        params = count_parameters(folder)
        cfg = PolicyConfig(model_name=folder, train_micro_batch_size=args.micro_batch,
                           max_total_sequence_length=args.seq, logprob_batch_size=args.micro_batch)
        builders = {"megatron": make_megatron, "dtensor": make_dtensor}
        policies, errors = {}, {}
        for name in args.backends.split(","):
            try:
                policies[name] = builders[name](cfg, dtype)
            except Exception:  # report and go on with the other backend
                errors[name] = traceback.format_exc(limit=4)
        batch = make_batch(args.batch, args.seq, args.vocab, device)
        times: dict[str, list[float]] = {n: [] for n in policies}
        for i in range(args.warmup + args.steps):
            for name in list(policies):
                try:
                    sync()
                    t0 = time.perf_counter()
                    policies[name].train_step(batch, nll_loss)
                    sync()
                except Exception:
                    errors[name] = traceback.format_exc(limit=6)
                    policies.pop(name).close()
                    continue
                if i >= args.warmup:
                    times[name].append(time.perf_counter() - t0)
        for policy in policies.values():
            policy.close()

    tokens = args.batch * args.seq
    gpu = torch.cuda.get_device_name() if torch.cuda.is_available() else "cpu (smoke run: MFU is meaningless)"
    print(f"device: {gpu}; model: {params / 1e6:,.1f}M parameters, {args.dtype}; batch {args.batch} x {args.seq} "
          f"= {tokens} tokens, micro-batch {args.micro_batch}; peak {args.peak_tflops:g} TFLOP/s")
    medians = {}
    for name, ts in times.items():
        if not ts:
            continue
        medians[name] = m = statistics.median(ts)
        mfu = 6 * params * tokens / m / (args.peak_tflops * 1e12)
        print(f"{name:9s} step: median {m * 1e3:9.1f} ms over {len(ts)} steps, {tokens / m:12,.0f} tok/s, MFU {mfu:6.1%}")
    if torch.cuda.is_available():
        print(f"peak GPU memory allocated: {torch.cuda.max_memory_allocated() / 2**30:.1f} GiB")
    if len(medians) == 2:
        print(f"ratio Megatron / DTensor: {medians['megatron'] / medians['dtensor']:.3f}")
    for name, trace in errors.items():
        print(f"{name} FAILED:\n{trace}")


if __name__ == "__main__":
    main()
