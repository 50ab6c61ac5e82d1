"""Fixed row counts, token-budget microbatches and sequence packing on one mixed-length batch (issue 17, item 5).

The work: one logprob pass and one train step (gradients + AdamW) of the Megatron policy over 32 rows whose
lengths are spread evenly from 16 to 512 tokens (math answers are that uneven), fp32, one thread. Fixed:
``train_micro_batch_size = logprob_batch_size = 8`` rows, each microbatch padded to its longest row. Dynamic:
``policy.dynamic_batching`` with the same memory ceiling (8 x 512 padded tokens per pass). Packed:
``policy.sequence_packing`` with the same ceiling in tokens (rows concatenated, no padding, attention row by
row). The three run alternately in one process (``--repeats`` times each) so that the machine's load hits them
alike; the figure is real (unpadded) tokens per process CPU-second, and the ratios to fixed. The positions each
plan computes are printed too: the gain should follow them, less what attention row by row costs.

Usage: python bench/dynamic_batching.py [--preset tiny] [--repeats 3] [--rows 32 --shortest 16 --longest 512]
Last line: ``dynamic_over_fixed_tokens_per_cpu_s=<ratio> packed_over_fixed_tokens_per_cpu_s=<ratio>
packed_over_dynamic_tokens_per_cpu_s=<ratio>``.
"""

from __future__ import annotations

import os

os.environ["OMP_NUM_THREADS"] = "1"
os.environ.setdefault("HF_HUB_OFFLINE", "1")

import argparse  # noqa: E402
import statistics  # noqa: E402
import tempfile  # noqa: E402
import time  # noqa: E402


def mixed_length_batch(num_rows: int, shortest: int, longest: int, vocab: int = 100):
    """Rows of lengths spread evenly over [shortest, longest] in shuffled order, random tokens and advantages."""
    import torch

    from rlkit.trajectories import Trajectories

    g = torch.Generator().manual_seed(0)
    lengths = torch.linspace(shortest, longest, num_rows).round().long()[torch.randperm(num_rows, generator=g)]
    pos = torch.arange(longest).unsqueeze(0)
    attention = pos < lengths.unsqueeze(1)
    loss_mask = attention & (pos >= 8)
    ids = torch.where(attention, torch.randint(3, vocab, (num_rows, longest), generator=g), 0)
    adv = torch.randn(num_rows, 1, generator=g).expand(num_rows, longest) * loss_mask
    return Trajectories(prompts=("p",) * num_rows, completions=("c",) * num_rows, input_ids=ids,
                        attention_mask=attention, loss_mask=loss_mask, generator_logprobs=torch.zeros(num_rows, longest),
                        finish_reasons=("stop",) * num_rows, group_size=1, policy_version=0, advantages=adv)


def token_mean_loss(logprobs, batch, counts):
    loss = (-batch.advantages * logprobs * batch.loss_mask).sum() / counts.valid_tokens
    return loss, {"loss": loss.detach()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--preset", default="tiny")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--rows", type=int, default=32)
    parser.add_argument("--shortest", type=int, default=16)
    parser.add_argument("--longest", type=int, default=512)
    args = parser.parse_args()

    import torch

    torch.set_num_threads(1)
    from rlkit.config.components import DynamicBatchingConfig, PolicyConfig, SequencePackingConfig
    from rlkit.models.factory import make_model
    from rlkit.policy.factory import in_process_policy
    from rlkit.policy.packing import packed_tokens, packing_plan
    from rlkit.policy.token_budget import padded_tokens, row_count_plan, token_budget_plan

    rows, shortest, longest, per_pass = args.rows, args.shortest, args.longest, 8
    batch = mixed_length_batch(rows, shortest, longest)
    lengths = batch.attention_mask.sum(1).tolist()
    real_tokens = sum(lengths)
    with tempfile.TemporaryDirectory() as tmp:
        path = make_model(f"{tmp}/model", args.preset, "llama", seed=0)
        base = PolicyConfig(model_name=str(path), max_total_sequence_length=longest, train_micro_batch_size=per_pass,
                            logprob_batch_size=per_pass)
        policies = {"fixed": in_process_policy(base),
                    "dynamic": in_process_policy(base.model_copy(update={"dynamic_batching": DynamicBatchingConfig(enabled=True)})),
                    "packed": in_process_policy(base.model_copy(update={"sequence_packing": SequencePackingConfig(enabled=True)}))}
        plans = {"fixed": row_count_plan(rows, per_pass), "dynamic": token_budget_plan(lengths, per_pass * longest),
                 "packed": packing_plan(lengths, per_pass * longest)}
        computed = {"fixed": padded_tokens(plans["fixed"], lengths), "dynamic": padded_tokens(plans["dynamic"], lengths),
                    "packed": packed_tokens(plans["packed"], lengths)}
        cpu: dict[str, list[float]] = {name: [] for name in policies}
        try:
            for _ in range(args.repeats + 1):  # the first round warms up (allocator, kernels) and is dropped
                for name, policy in policies.items():
                    start = time.process_time()
                    policy.logprobs(batch.input_ids, batch.attention_mask)
                    policy.train_step(batch, token_mean_loss)
                    cpu[name].append(time.process_time() - start)
        finally:
            for policy in policies.values():
                policy.close()
    print(f"{rows} rows, lengths {shortest}..{longest} ({real_tokens} real tokens), preset {args.preset}, "
          f"one logprob pass + one train step, process CPU-s, median of {args.repeats} (load: "
          f"{os.getloadavg()[0]:.1f} on {os.cpu_count()} cores)")
    rate = {}
    for name in policies:
        seconds = statistics.median(cpu[name][1:])
        rate[name] = real_tokens / seconds
        print(f"  {name:8s} {len(plans[name]):3d} passes  {computed[name]:6d} positions computed  "
              f"{seconds:6.2f} cpu-s  {rate[name]:8.0f} tokens/cpu-s")
    print(f"dynamic_over_fixed_tokens_per_cpu_s={rate['dynamic'] / rate['fixed']:.2f} "
          f"packed_over_fixed_tokens_per_cpu_s={rate['packed'] / rate['fixed']:.2f} "
          f"packed_over_dynamic_tokens_per_cpu_s={rate['packed'] / rate['dynamic']:.2f}")


if __name__ == "__main__":
    main()
