"""The task of bench/vs_trl_real.py, shared by its two sides: 2-digit addition and subtraction as chat prompts, the
reward, and the held-out greedy evaluation.

Imports nothing of rlkit and nothing of TRL (TRL's side runs in bench/.venv-trl), so both processes import this
one file: rlkit as ``env.reward_fn: arith_chat:last_number_reward``, TRL as ``reward_funcs=[last_number_reward]``.

- :func:`make_splits`: seeded, disjoint train and held-out rows ``{"prompt", "answer"}``, e.g. "What is 47 + 38?
  Answer with just the number." / "85"; operands 10..99, so an answer is -89..198.
- :func:`last_number_reward`: TRL's signature; 1.0 when the last integer of the completion equals the answer.
  A completion is a string (rlkit) or a list of messages (TRL's conversational format), whose last one is read.
- :func:`greedy_accuracy`: transformers' own greedy ``generate`` on a model folder (the base, or a side's merged
  export), prompts rendered by the folder's chat template, batched with left padding; both sides' models are
  scored by this one function in one interpreter. ``python bench/arith_chat.py eval FOLDER ROWS.jsonl`` prints
  its result as one JSON line.
"""

from __future__ import annotations

import json
import random
import re
import sys
from pathlib import Path
from typing import Any, Iterable

NUMBER = re.compile(r"-?\d+")
QUESTION = "What is {a} {op} {b}? Answer with just the number."


def make_splits(num_train: int = 2000, num_heldout: int = 200, seed: int = 0) -> tuple[list[dict], list[dict]]:
    """``num_train`` and ``num_heldout`` rows with distinct prompts (no prompt in both), drawn with ``seed``."""
    rng = random.Random(seed)
    rows: dict[str, str] = {}  # prompt -> answer, in draw order
    while len(rows) < num_train + num_heldout:  # 16,200 distinct prompts exist
        a, b, op = rng.randint(10, 99), rng.randint(10, 99), rng.choice("+-")
        rows.setdefault(QUESTION.format(a=a, op=op, b=b), str(a + b if op == "+" else a - b))
    items = [{"prompt": p, "answer": v} for p, v in rows.items()]
    return items[num_heldout:], items[:num_heldout]


def _text(completion: Any) -> str:
    if isinstance(completion, list):  # TRL's conversational format: [{"role": "assistant", "content": ...}]
        return str(completion[-1]["content"]) if completion else ""
    return str(completion)


def last_number_reward(prompts: list, completions: list, answer: list, **_: Any) -> list[float]:
    """1.0 for each completion whose last integer (``-?\\d+``) is its row's answer, else 0.0."""
    out = []
    for completion, expected in zip(completions, answer):
        numbers = NUMBER.findall(_text(completion))
        out.append(1.0 if numbers and int(numbers[-1]) == int(expected) else 0.0)
    return out


def write_jsonl(rows: Iterable[dict], path: Path) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def read_jsonl(path: Path) -> list[dict]:
    return [json.loads(line) for line in Path(path).read_text().splitlines() if line.strip()]


def greedy_accuracy(folder: str | Path, rows: list[dict], max_new_tokens: int = 32, batch_size: int = 50) -> dict:
    """Held-out accuracy of the model in ``folder``: greedy completions of every row, scored by
    :func:`last_number_reward`. Returns ``{"accuracy", "correct", "n", "mean_new_tokens"}``."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(folder, padding_side="left")
    model = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32).eval()
    correct, new_tokens = 0.0, 0
    for start in range(0, len(rows), batch_size):
        chunk = rows[start:start + batch_size]
        texts = [tokenizer.apply_chat_template([{"role": "user", "content": r["prompt"]}], tokenize=False,
                                               add_generation_prompt=True) for r in chunk]
        inputs = tokenizer(texts, add_special_tokens=False, padding=True, return_tensors="pt")
        with torch.no_grad():
            out = model.generate(**inputs, do_sample=False, max_new_tokens=max_new_tokens,
                                 pad_token_id=tokenizer.pad_token_id)
        completions = out[:, inputs["input_ids"].shape[1]:]  # [b, <= max_new_tokens]
        new_tokens += int((completions != tokenizer.pad_token_id).sum())
        texts_out = tokenizer.batch_decode(completions, skip_special_tokens=True)
        correct += sum(last_number_reward(texts, texts_out, [r["answer"] for r in chunk]))
    return {"accuracy": correct / len(rows), "correct": int(correct), "n": len(rows),
            "mean_new_tokens": new_tokens / len(rows)}


if __name__ == "__main__":
    if len(sys.argv) != 4 or sys.argv[1] != "eval":
        raise SystemExit("usage: python bench/arith_chat.py eval MODEL_FOLDER ROWS.jsonl")
    import os

    import torch

    torch.set_num_threads(int(os.environ.get("OMP_NUM_THREADS", "2")))
    print(json.dumps(greedy_accuracy(sys.argv[2], read_jsonl(Path(sys.argv[3])))))
