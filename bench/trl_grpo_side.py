"""The TRL side of bench/vs_trl.py: TRL's ``GRPOTrainer`` on a model folder and a prompt/answer JSONL file.

Runs in bench/.venv-trl (scripts/setup-bench-trl.sh), never in rlkit's environment, and imports nothing of
rlkit. Generation is transformers' (TRL's default without vLLM), the KL penalty off (``beta=0``), one update
per batch. Prints one JSON line: CPU-seconds per step over the steps after the warm-up (every thread of this
process), wall seconds per step, peak RSS.

Usage: trl_grpo_side.py MODEL_FOLDER DATA.jsonl --prompts N --generations G --max-new-tokens T --steps S
       --warmup W --lr LR [--bf16]
"""

from __future__ import annotations

import os

os.environ.setdefault("OMP_NUM_THREADS", "1")
os.environ.setdefault("HF_HUB_OFFLINE", "1")

import argparse  # noqa: E402
import json  # noqa: E402
import resource  # noqa: E402
import tempfile  # noqa: E402
import time  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("model")
    parser.add_argument("data")
    for name, kind in (("prompts", int), ("generations", int), ("max-new-tokens", int), ("steps", int),
                       ("warmup", int), ("lr", float)):
        parser.add_argument(f"--{name}", type=kind, required=True)
    parser.add_argument("--bf16", action="store_true")
    args = parser.parse_args()

    import torch
    from datasets import load_dataset
    from transformers import AutoModelForCausalLM, AutoTokenizer, TrainerCallback
    from trl import GRPOConfig, GRPOTrainer

    torch.set_num_threads(int(os.environ["OMP_NUM_THREADS"]))
    rows = load_dataset("json", data_files=args.data, split="train")
    rows = rows.map(lambda r: {"prompt": [{"role": "user", "content": r["prompt"]}], "answer": r["answer"]})

    def reward(completions, answer, **_):
        return [1.0 if str(a) in c[0]["content"] else 0.0 for c, a in zip(completions, answer)]

    marks: list[tuple[float, float]] = []

    class StepClock(TrainerCallback):
        def on_step_end(self, *_, **__):
            marks.append((time.process_time(), time.perf_counter()))

    dtype = torch.bfloat16 if args.bf16 else torch.float32
    model = AutoModelForCausalLM.from_pretrained(args.model, dtype=dtype)
    with tempfile.TemporaryDirectory() as out:
        config = GRPOConfig(
            output_dir=out, use_cpu=True, bf16=args.bf16, report_to="none", save_strategy="no", logging_steps=1,
            max_steps=args.warmup + args.steps, learning_rate=args.lr, beta=0.0, num_iterations=1,
            per_device_train_batch_size=args.prompts * args.generations, gradient_accumulation_steps=1,
            num_generations=args.generations, max_completion_length=args.max_new_tokens, temperature=1.0,
            top_p=1.0, top_k=0, use_vllm=False, disable_dropout=True, dataloader_num_workers=0, seed=0)
        trainer = GRPOTrainer(model=model, reward_funcs=reward, args=config, train_dataset=rows,
                              processing_class=AutoTokenizer.from_pretrained(args.model), callbacks=[StepClock()])
        trainer.train()
    (c0, w0), (c1, w1) = marks[args.warmup - 1], marks[-1]
    print(json.dumps({"side": "trl", "cpu_s_per_step": (c1 - c0) / args.steps, "wall_s_per_step": (w1 - w0) / args.steps,
                      "peak_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
                      "threads": torch.get_num_threads(), "steps": len(marks)}))


if __name__ == "__main__":
    main()
