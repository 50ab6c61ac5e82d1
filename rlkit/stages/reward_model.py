"""Training a reward model on preference pairs: an HF sequence-classification model with one output, read from a
causal-LM folder (its transformer, a new linear ``score`` head), trained with the Bradley-Terry loss
(:func:`rlkit.algorithms.preference.bradley_terry_loss`, TRL's ``RewardTrainer`` formula) and saved as an HF folder
that :class:`rlkit.envs.RewardModelEnvironment` loads.

Each response is scored as the environment will score it at rollout time: the conversation (system prompt, the
user's prompt, the assistant's response) rendered by the chat template (:func:`rlkit.envs.reward_model.
conversation_text`) and tokenized by :func:`rlkit.envs.reward_model.encode_texts`; the score is the head's output at
the last real token (transformers' rule for sequence classification, with ``pad_token_id`` set: the rightmost token
that is not the pad token).

The model is a value model (:mod:`rlkit.policy.value_model`) on ``reward_model.backend``: transformers'
sequence-classification model in this process (``transformers``), or the policy's backend in its layout (``policy``:
Megatron-Core with tensor and sequence parallelism, its head a [1, hidden] linear without a bias; DTensor, that
transformers model sharded with FSDP2). Either way the
folder written is transformers' sequence-classification model (``score.weight``), which the environment loads.

Deliberate simplifications: fp32, one batch of pairs per step (no microbatching).
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Mapping, Optional, Sequence

import torch
from tqdm.auto import tqdm

from rlkit.algorithms.preference import bradley_terry_loss
from rlkit.config.components import PolicyConfig
from rlkit.config.run import RewardModelConfig
from rlkit.data import PromptSampler
from rlkit.envs.reward_model import conversation_text, encode_texts
from rlkit.policy.value_model import ValueModel, build_value_model, clip_gradients

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


def last_real_token(input_ids: torch.Tensor, pad_token_id: int) -> torch.Tensor:
    """Each row's last position [B] whose token is not ``pad_token_id`` (transformers' sequence-classification rule)."""
    positions = torch.arange(input_ids.shape[1], device=input_ids.device)
    return (positions * (input_ids != pad_token_id)).argmax(-1)


def value_pair_scores(value_model: ValueModel, tokenizer: Any, pairs: Sequence[Pair], system_prompt: Optional[str],
                      max_length: Optional[int]) -> tuple[torch.Tensor, torch.Tensor]:
    """A value model's scores of the chosen and the rejected responses, each [N]: its head at each text's last real
    token, as :func:`pair_scores` reads a sequence-classification model."""
    enc = encode_texts(tokenizer, pair_texts(tokenizer, pairs, system_prompt), max_length)
    values = value_model.head_values(enc["input_ids"], enc["attention_mask"])  # [2N, t]
    last = last_real_token(enc["input_ids"], tokenizer.pad_token_id)
    return values[torch.arange(values.shape[0]), last].chunk(2)


@torch.no_grad()
def pair_accuracy(value_model: ValueModel, tokenizer: Any, pairs: Sequence[Pair], system_prompt: Optional[str] = None,
                  max_length: Optional[int] = None, batch_size: int = 32) -> float:
    """The share of ``pairs`` whose chosen response ``value_model`` scores above the rejected one."""
    value_model.module.eval()
    right = 0
    for start in range(0, len(pairs), batch_size):
        chosen, rejected = value_pair_scores(value_model, tokenizer, pairs[start:start + batch_size], system_prompt,
                                             max_length)
        right += int((chosen > rejected).sum())
    return right / max(len(pairs), 1)


def reward_model_tokenizer(folder: str | Path) -> Any:
    """``folder``'s tokenizer with a pad token (EOS when it has none)."""
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(str(folder))
    if tokenizer.pad_token_id is None:
        tokenizer.pad_token = tokenizer.eos_token
    return tokenizer


def save_sequence_classifier(value_model: ValueModel, base: str | Path, output: str | Path, tokenizer: Any,
                             write: bool = True) -> Path:
    """``value_model`` (without a head bias) as transformers' one-output sequence-classification folder on ``base``'s
    config (``pad_token_id`` set), with ``tokenizer``; strict on names and shapes. Every rank calls (the export
    gathers); only ``write`` ranks write."""
    from transformers import AutoConfig, AutoModelForSequenceClassification

    state = value_model.export_hf_state()
    output = Path(output)
    if not write:
        return output
    config = AutoConfig.from_pretrained(str(base), num_labels=1)
    config.pad_token_id = tokenizer.pad_token_id
    model = AutoModelForSequenceClassification.from_config(config, dtype=torch.float32)
    model.load_state_dict(state, strict=True)
    model.save_pretrained(output)
    tokenizer.save_pretrained(output)
    return output


def train_reward_model(base: str | Path, pairs: Sequence[Pair], output: str | Path, cfg: RewardModelConfig, *,
                       eval_pairs: Sequence[Pair] = (), system_prompt: Optional[str] = None, seed: int = 0,
                       progress: bool = False, policy: Optional[PolicyConfig] = None) -> RewardModelResult:
    """``cfg.num_steps`` AdamW steps of ``cfg.batch_size`` pairs from ``pairs`` on the reward model built from the
    causal-LM folder ``base`` on ``cfg.backend`` (``policy``: the policy's config, read by ``backend=policy``); the
    held-out pair accuracy on ``eval_pairs``; saved to ``output`` (model and tokenizer), where
    :class:`rlkit.envs.RewardModelEnvironment` loads it."""
    if not pairs:
        raise ValueError("train_reward_model needs preference pairs (prompt, chosen, rejected); got none")
    t0 = time.perf_counter()
    tokenizer = reward_model_tokenizer(base)
    value_model = build_value_model(cfg.backend, base, bias=False, seed=seed, policy=policy,
                                    key="reward_model.backend")
    try:
        losses, accuracies = _train(value_model, tokenizer, pairs, cfg, system_prompt, seed, progress)
        held_out = (pair_accuracy(value_model, tokenizer, list(eval_pairs), system_prompt, cfg.max_length)
                    if eval_pairs else None)
        output = save_sequence_classifier(value_model, base, output, tokenizer, write=_writes())
    finally:
        value_model.close()
    return RewardModelResult(tuple(losses), tuple(accuracies), held_out, output, time.perf_counter() - t0)


def reward_model_step(value_model: ValueModel, optimizer: torch.optim.Optimizer, tokenizer: Any, batch: Sequence[Pair],
                      cfg: RewardModelConfig, system_prompt: Optional[str]) -> tuple[float, float]:
    """One AdamW step on the Bradley-Terry loss of ``batch``'s pairs; the loss and the pair accuracy before it."""
    value_model.module.train()
    optimizer.zero_grad(set_to_none=True)
    value_model.microbatch_starting(0, 1)
    chosen, rejected = value_pair_scores(value_model, tokenizer, batch, system_prompt, cfg.max_length)
    loss = bradley_terry_loss(chosen, rejected, center_coefficient=cfg.center_rewards_coefficient)
    loss.backward()
    value_model.reduce_grads()
    params = [p for _, p in value_model.named_trained_parameters()]
    clip_gradients(params, value_model.grad_norm(), cfg.max_grad_norm)
    optimizer.step()
    return float(loss.detach()), float((chosen > rejected).float().mean())


def _train(value_model: ValueModel, tokenizer: Any, pairs: Sequence[Pair], cfg: RewardModelConfig,
           system_prompt: Optional[str], seed: int, progress: bool) -> tuple[list[float], list[float]]:
    optimizer = torch.optim.AdamW([p for _, p in value_model.named_trained_parameters()], lr=cfg.lr,
                                  weight_decay=0.0)
    sampler = PromptSampler([dict(p) for p in pairs], cfg.batch_size, seed=seed)
    losses, accuracies = [], []
    for _ in tqdm(range(cfg.num_steps), desc="reward model", disable=not progress):
        loss, accuracy = reward_model_step(value_model, optimizer, tokenizer, sampler.next_batch(), cfg, system_prompt)
        losses.append(loss)
        accuracies.append(accuracy)
    return losses, accuracies


def _writes() -> bool:
    """Whether this process writes the folder: the first rank (all hold the same full tensors after the export)."""
    import torch.distributed as dist

    return not dist.is_initialized() or dist.get_rank() == 0
