"""Training a reward model on preference pairs: an HF sequence-classification model with one output, read from a
causal-LM folder (its transformer, a new linear ``score`` head), trained with the Bradley-Terry loss
(:func:`rlkit.algorithms.preference.bradley_terry_loss`, TRL's ``RewardTrainer`` formula) and saved as an HF folder
that :class:`rlkit.envs.RewardModelEnvironment` loads.

Each response is scored as the environment will score it at rollout time: the conversation (system prompt, the
user's prompt, the assistant's response) rendered by the chat template (:func:`rlkit.envs.reward_model.
conversation_text`) and tokenized by :func:`rlkit.envs.reward_model.encode_texts`; the score is the head's output at
the last real token (transformers' rule for sequence classification, with ``pad_token_id`` set).

Deliberate simplifications: transformers' model in this process, fp32, one batch of pairs per step (no
microbatching, no parallel layout): a reward model for the small models rlkit trains on a CPU; on the policy's own
backends it is still to come.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Mapping, Optional, Sequence

import torch
from tqdm.auto import tqdm

from rlkit.algorithms.preference import bradley_terry_loss
from rlkit.config.run import RewardModelConfig
from rlkit.data import PromptSampler
from rlkit.envs.reward_model import conversation_text, encode_texts

Pair = Mapping[str, Any]  # prompt, chosen, rejected


@dataclass(frozen=True)
class RewardModelResult:
    """Each step's loss and pair accuracy (train batch), the held-out pair accuracy at the end, the folder."""

    losses: tuple[float, ...]
    accuracies: tuple[float, ...]
    eval_accuracy: Optional[float]  # share of held-out pairs scored chosen > rejected; None without eval pairs
    output: Path
    seconds: float

    def __repr__(self) -> str:
        tail = f", held-out pair accuracy {self.eval_accuracy:.3f}" if self.eval_accuracy is not None else ""
        last = f"final loss {self.losses[-1]:.4f}" if self.losses else "no steps"
        return f"RewardModelResult({len(self.losses)} steps, {last}{tail}, {self.seconds:.1f}s, {self.output})"


def pair_texts(tokenizer: Any, pairs: Sequence[Pair], system_prompt: Optional[str] = None) -> list[str]:
    """The N chosen conversations' texts, then the N rejected ones' [2N], as the environment renders them."""
    head = [{"role": "system", "content": system_prompt}] if system_prompt else []

    def text(prompt: str, response: str) -> str:
        return conversation_text(tokenizer, [*head, {"role": "user", "content": prompt},
                                             {"role": "assistant", "content": response}])
    return ([text(p["prompt"], p["chosen"]) for p in pairs] + [text(p["prompt"], p["rejected"]) for p in pairs])


def pair_scores(model: Any, tokenizer: Any, pairs: Sequence[Pair], system_prompt: Optional[str],
                max_length: Optional[int]) -> tuple[torch.Tensor, torch.Tensor]:
    """The model's scores of the chosen and the rejected responses, each [N]."""
    enc = encode_texts(tokenizer, pair_texts(tokenizer, pairs, system_prompt), max_length)
    scores = model(input_ids=enc["input_ids"], attention_mask=enc["attention_mask"]).logits[:, 0]
    return scores.chunk(2)


@torch.no_grad()
def pair_accuracy(model: Any, tokenizer: Any, pairs: Sequence[Pair], system_prompt: Optional[str] = None,
                  max_length: Optional[int] = None, batch_size: int = 32) -> float:
    """The share of ``pairs`` whose chosen response ``model`` scores above the rejected one."""
    model.eval()
    right = 0
    for start in range(0, len(pairs), batch_size):
        chosen, rejected = pair_scores(model, tokenizer, pairs[start:start + batch_size], system_prompt, max_length)
        right += int((chosen > rejected).sum())
    return right / max(len(pairs), 1)


def load_reward_model_base(folder: str | Path) -> tuple[Any, Any]:
    """A one-output sequence-classification model on ``folder``'s transformer (a new ``score`` head) and its
    tokenizer, with a pad token (EOS when the tokenizer has none)."""
    from transformers import AutoModelForSequenceClassification, AutoTokenizer
    from transformers.utils import logging as hf_logging

    tokenizer = AutoTokenizer.from_pretrained(str(folder))
    if tokenizer.pad_token_id is None:
        tokenizer.pad_token = tokenizer.eos_token
    verbosity = hf_logging.get_verbosity()
    hf_logging.set_verbosity_error()  # "some weights were newly initialized": the score head, as intended
    try:
        model = AutoModelForSequenceClassification.from_pretrained(str(folder), num_labels=1, dtype=torch.float32)
    finally:
        hf_logging.set_verbosity(verbosity)
    model.config.pad_token_id = tokenizer.pad_token_id
    return model, tokenizer


def train_reward_model(base: str | Path, pairs: Sequence[Pair], output: str | Path, cfg: RewardModelConfig, *,
                       eval_pairs: Sequence[Pair] = (), system_prompt: Optional[str] = None, seed: int = 0,
                       progress: bool = False) -> RewardModelResult:
    """``cfg.num_steps`` AdamW steps of ``cfg.batch_size`` pairs from ``pairs`` on the reward model built from the
    causal-LM folder ``base``; the held-out pair accuracy on ``eval_pairs``; saved to ``output`` (model and
    tokenizer), where :class:`rlkit.envs.RewardModelEnvironment` loads it."""
    if not pairs:
        raise ValueError("train_reward_model needs preference pairs (prompt, chosen, rejected); got none")
    t0 = time.perf_counter()
    torch.manual_seed(seed)
    model, tokenizer = load_reward_model_base(base)
    optimizer = torch.optim.AdamW(model.parameters(), lr=cfg.lr, weight_decay=0.0)
    sampler = PromptSampler([dict(p) for p in pairs], cfg.batch_size, seed=seed)
    losses, accuracies = [], []
    model.train()
    for _ in tqdm(range(cfg.num_steps), desc="reward model", disable=not progress):
        chosen, rejected = pair_scores(model, tokenizer, sampler.next_batch(), system_prompt, cfg.max_length)
        loss = bradley_terry_loss(chosen, rejected, center_coefficient=cfg.center_rewards_coefficient)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        if cfg.max_grad_norm is not None:
            torch.nn.utils.clip_grad_norm_(model.parameters(), cfg.max_grad_norm)
        optimizer.step()
        losses.append(float(loss.detach()))
        accuracies.append(float((chosen > rejected).float().mean()))
    held_out = pair_accuracy(model, tokenizer, list(eval_pairs), system_prompt, cfg.max_length) if eval_pairs else None
    output = Path(output)
    model.save_pretrained(output)
    tokenizer.save_pretrained(output)
    return RewardModelResult(tuple(losses), tuple(accuracies), held_out, output, time.perf_counter() - t0)
