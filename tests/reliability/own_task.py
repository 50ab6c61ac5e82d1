"""Issue 30's own task, as a user writes it: reverse a 2-4 letter word, a JSONL of prompt and answer, a reward
function in a module of their own (``reverse_rewards.py``) in their working folder."""

from __future__ import annotations

import json
import random
from pathlib import Path

REWARD_MODULE = '''
def reverse_reward(prompts, completions, answer, **columns):
    """1 for the reversed word, else 0.1 per letter in its place (an untrained model's rewards differ in a group)."""
    return [1.0 if c.strip() == a else 0.1 * sum(x == y for x, y in zip(c.strip(), a))
            for c, a in zip(completions, answer)]
'''


def write_task(folder: Path, rows: int = 160, module: str = "reverse_rewards", answer_key: str = "answer") -> Path:
    """``folder/words.jsonl`` (``rows`` distinct words) and ``folder/<module>.py``; returns the JSONL path."""
    folder.mkdir(parents=True, exist_ok=True)
    rng, words = random.Random(0), set()
    while len(words) < rows:
        words.add("".join(rng.choice("abcdefghijklmnopqrstuvwxyz") for _ in range(rng.randint(2, 4))))
    path = folder / "words.jsonl"
    path.write_text("".join(json.dumps({"prompt": f"reverse {w}", answer_key: w[::-1]}) + "\n" for w in sorted(words)))
    (folder / f"{module}.py").write_text(REWARD_MODULE)
    return path


def task_overrides(tmp_path: Path, data_path: Path, **extra) -> dict:
    """A small session on the task: the nano model made in tmp_path, 4 prompts x 4 samples, a short SFT."""
    values = {
        "policy.model_name": str(tmp_path / "model"),
        "policy.model_preset": "nano",
        "policy.train_micro_batch_size": 8,
        "policy.logprob_batch_size": 16,
        "policy.max_total_sequence_length": 40,
        "policy.generation.max_new_tokens": 6,
        "grpo.num_prompts_per_step": 4,
        "grpo.num_generations_per_prompt": 4,
        "grpo.use_dynamic_sampling": False,
        "grpo.max_num_steps": 1,
        "data.task": None,
        "data.path": str(data_path),
        "sft.enabled": True,
        "sft.num_steps": 2,
        "sft.batch_size": 8,
        "sft.warmup_steps": 0,
        "eval.num_prompts": 8,
        "logger.log_dir": str(tmp_path / "runs"),
    }
    values.update(extra)
    return values
