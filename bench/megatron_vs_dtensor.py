"""Training step time of the Megatron policy divided by the DTensor/FSDP2 policy's, same model and batch, one run.

Both policies live in this process on the same HF weights (preset ``small``, ~20M parameters, fp32) and take
full optimizer steps (forward, backward, clipping, AdamW) on the same batch with the same loss (token-mean
NLL, the compute of an RL loss). Steps alternate, Megatron then DTensor, so drift in machine load hits both
equally; medians after warm-up. Usage: python bench/megatron_vs_dtensor.py [--preset small] [--steps 5]
"""

from __future__ import annotations

import argparse
import os
import statistics
import tempfile
import time

import torch


def make_batch(batch: int, seq: int, vocab: int, seed: int = 0):
    from rlkit.trajectories import Trajectories

    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(3, vocab, (batch, seq), generator=g)
    attention = torch.ones(batch, seq, dtype=torch.bool)
    loss_mask = attention.clone()
    loss_mask[:, : seq // 4] = False  # a prompt quarter that the loss does not see
    return Trajectories(prompts=("",) * batch, completions=("",) * batch, input_ids=ids, attention_mask=attention,
                        loss_mask=loss_mask, generator_logprobs=torch.zeros(batch, seq),
                        finish_reasons=("stop",) * batch, group_size=1, policy_version=0)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--preset", default="small")
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--seq", type=int, default=256)
    parser.add_argument("--micro-batch", type=int, default=8)
    parser.add_argument("--steps", type=int, default=5)
    parser.add_argument("--warmup", type=int, default=1)
    args = parser.parse_args()
    os.environ.setdefault("HF_HUB_OFFLINE", "1")

    from rlkit.config.components import PolicyConfig
    from rlkit.models import make_model
    from rlkit.models.factory import count_parameters
    from rlkit.policy.dtensor import DTensorPolicy
    from rlkit.policy.megatron.policy import MegatronPolicy
    from rlkit.stages.sft import nll_loss

    with tempfile.TemporaryDirectory() as tmp:
        path = make_model(f"{tmp}/model", args.preset, "llama", seed=0)
        cfg = PolicyConfig(model_name=str(path), train_micro_batch_size=args.micro_batch, max_total_sequence_length=args.seq)
        megatron = MegatronPolicy(cfg)
        dtensor = DTensorPolicy(cfg.model_copy(update={"backend": "dtensor"}))
        batch = make_batch(args.batch, args.seq, megatron.arch.vocab_size)
        times: dict[str, list[float]] = {"megatron": [], "dtensor": []}
        for i in range(args.warmup + args.steps):
            for name, policy in (("megatron", megatron), ("dtensor", dtensor)):
                t0 = time.perf_counter()
                policy.train_step(batch, nll_loss)
                if i >= args.warmup:
                    times[name].append(time.perf_counter() - t0)
        params = count_parameters(path)
        megatron.close()
        dtensor.close()

    m, d = statistics.median(times["megatron"]), statistics.median(times["dtensor"])
    tokens = args.batch * args.seq
    print(f"model: preset {args.preset!r}, {params / 1e6:.1f}M parameters, fp32; batch {args.batch} x {args.seq} "
          f"tokens, micro-batch {args.micro_batch}; torch threads {torch.get_num_threads()}")
    print(f"Megatron-Core step: median {m * 1e3:8.1f} ms over {args.steps} steps ({tokens / m:,.0f} tok/s)")
    print(f"DTensor/FSDP2 step: median {d * 1e3:8.1f} ms over {args.steps} steps ({tokens / d:,.0f} tok/s)")
    print(f"ratio Megatron / DTensor: {m / d:.3f}")
    print(f"megatron_over_dtensor={m / d:.3f}")


if __name__ == "__main__":
    main()
