"""The TRL side of bench/vs_trl.py and bench/vs_trl_real.py: TRL's ``GRPOTrainer`` on a model folder and a
prompt/answer JSONL file.

Runs in bench/.venv-trl (scripts/setup-bench-trl.sh), never in rlkit's environment, and imports nothing of
rlkit. Generation is transformers' (TRL's default without vLLM), the KL penalty off (``beta=0``), one update
per batch, a constant learning rate. Prints one JSON line: CPU-seconds per step over the steps after the
warm-up (every thread of this process), wall seconds per step, peak RSS, the mean completion length of those
steps, and each step's distinct prompts in order (the caller checks that rlkit saw the same ones).

vs_trl_real.py's options: ``--reward MODULE:FUNCTION`` (a module in bench/; default: the answer appears in the
completion), ``--lora R`` (peft adapters on every linear layer, ``--lora-alpha``), ``--min-new-tokens`` (equal
completion lengths), ``--temperature``, ``--seed``, ``--no-shuffle`` (prompts in file order), ``--merged-out DIR``
(the trained model, adapters merged, saved there with the tokenizer).

Usage: trl_grpo_side.py MODEL_FOLDER DATA.jsonl --prompts N --generations G --max-new-tokens T --steps S
       --warmup W --lr LR [--bf16] [--reward M:F] [--lora R [--lora-alpha A]] [--min-new-tokens K]
       [--temperature X] [--seed S] [--no-shuffle] [--merged-out DIR]
"""

from __future__ import annotations

import os

os.environ.setdefault("OMP_NUM_THREADS", "1")
os.environ.setdefault("HF_HUB_OFFLINE", "1")

import argparse  # noqa: E402
import importlib  # noqa: E402
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
    parser.add_argument("--reward", help="MODULE:FUNCTION in bench/, TRL's signature (default: answer in completion)")
    parser.add_argument("--lora", type=int, default=0, help="peft adapters of this rank on every linear layer")
    parser.add_argument("--lora-alpha", type=float, default=32.0)
    parser.add_argument("--min-new-tokens", type=int, default=0)
    parser.add_argument("--temperature", type=float, default=1.0)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--no-shuffle", action="store_true", help="prompts in the file's order")
    parser.add_argument("--merged-out", help="save the trained model (adapters merged) and tokenizer here")
    args = parser.parse_args()

    import torch
    from datasets import load_dataset
    from transformers import AutoModelForCausalLM, AutoTokenizer, TrainerCallback
    from trl import GRPOConfig, GRPOTrainer

    torch.set_num_threads(int(os.environ["OMP_NUM_THREADS"]))
    rows = load_dataset("json", data_files=args.data, split="train")
    rows = rows.map(lambda r: {"prompt": [{"role": "user", "content": r["prompt"]}], "answer": r["answer"]})

    def contains_answer(completions, answer, **_):
        return [1.0 if str(a) in c[0]["content"] else 0.0 for c, a in zip(completions, answer)]

    if args.reward:
        module, _, name = args.reward.partition(":")
        scorer = getattr(importlib.import_module(module), name)  # this file's folder, bench/, is on sys.path
    else:
        scorer = contains_answer
    step_prompts: list[list[str]] = []  # each generation batch's distinct user prompts, in order

    def reward(prompts, completions, **columns):
        step_prompts.append(list(dict.fromkeys(p[-1]["content"] for p in prompts)))
        return scorer(prompts=prompts, completions=completions, **columns)

    reward.__name__ = scorer.__name__
    marks: list[tuple[float, float]] = []  # the start of training, then the end of each step
    lengths: list[float] = []  # completions/mean_length of each step

    class StepClock(TrainerCallback):
        def on_train_begin(self, *_, **__):
            marks.append((time.process_time(), time.perf_counter()))

        def on_step_end(self, *_, **__):
            marks.append((time.process_time(), time.perf_counter()))

        def on_log(self, *_, logs=None, **__):
            if logs and "completions/mean_length" in logs:
                lengths.append(logs["completions/mean_length"])

    dtype = torch.bfloat16 if args.bf16 else torch.float32
    model = AutoModelForCausalLM.from_pretrained(args.model, dtype=dtype)
    with tempfile.TemporaryDirectory() as out:
        config = GRPOConfig(
            output_dir=out, use_cpu=True, bf16=args.bf16, report_to="none", save_strategy="no", logging_steps=1,
            max_steps=args.warmup + args.steps, learning_rate=args.lr, beta=0.0, num_iterations=1,
            per_device_train_batch_size=args.prompts * args.generations, gradient_accumulation_steps=1,
            num_generations=args.generations, max_completion_length=args.max_new_tokens,
            temperature=args.temperature, top_p=1.0, top_k=0, use_vllm=False, disable_dropout=True,
            dataloader_num_workers=0, seed=args.seed, lr_scheduler_type="constant", shuffle_dataset=not args.no_shuffle,
            generation_kwargs={"min_new_tokens": args.min_new_tokens} if args.min_new_tokens else None)
        peft_config = None
        if args.lora:
            from peft import LoraConfig

            peft_config = LoraConfig(r=args.lora, lora_alpha=args.lora_alpha, lora_dropout=0.0,
                                     target_modules="all-linear", task_type="CAUSAL_LM")
        tokenizer = AutoTokenizer.from_pretrained(args.model)
        trainer = GRPOTrainer(model=model, reward_funcs=reward, args=config, train_dataset=rows,
                              processing_class=tokenizer, callbacks=[StepClock()], peft_config=peft_config)
        trainer.train()
    peak_rss_mb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # before the merge and save below
    if args.merged_out:
        trained = trainer.model.merge_and_unload() if args.lora else trainer.model
        trained.save_pretrained(args.merged_out)
        tokenizer.save_pretrained(args.merged_out)
    (c0, w0), (c1, w1) = marks[args.warmup], marks[-1]
    timed = lengths[args.warmup:]
    print(json.dumps({"side": "trl", "cpu_s_per_step": (c1 - c0) / args.steps,
                      "wall_s_per_step": (w1 - w0) / args.steps,
                      "peak_rss_mb": peak_rss_mb, "threads": torch.get_num_threads(), "steps": len(marks) - 1,
                      "completion_tokens_mean": sum(timed) / len(timed) if timed else None,
                      "step_prompts": step_prompts}))


if __name__ == "__main__":
    main()
