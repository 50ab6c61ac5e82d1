"""Rewards from a learned scorer: an HF sequence-classification reward model, or any batch scorer of yours.

:class:`ScorerEnvironment` turns a batch function ``scorer(texts) -> [B] scores`` into an environment: each
conversation is rendered to one text (the tokenizer's chat template when there is one, else the messages'
contents joined by newlines), the texts are scored ``batch_size`` at a time, and a chunk whose scoring raises
gives its samples reward 0 and one error each (the score stage's failure rules then apply).
:class:`RewardModelEnvironment` is that with an ``AutoModelForSequenceClassification`` (one label) as the scorer,
run in this process in float32 under ``torch.no_grad``: its scores are the model's own logits.

Deliberate simplifications: single-turn (the reward is the score of the whole conversation; a multi-turn judge
is a subclass answering with observations); texts longer than ``max_length`` tokens are cut from the left, so
the completion, which the score is about, is kept; scoring runs on the CPU or the model's device, unsharded.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, Optional, Sequence

from rlkit.envs.base import Conversation, Environment, EnvReturn, check_batch, sample_error

if TYPE_CHECKING:  # torch is imported where a model scores: the config's env registry loads this module
    from torch import Tensor

Scorer = Callable[[list[str]], "Sequence[float] | Tensor"]  # B texts -> B finite scores


def conversation_text(tokenizer: Any, conversation: Conversation) -> str:
    """``conversation`` as the text a scorer reads: the chat template's rendering, or the contents joined."""
    if tokenizer is not None and getattr(tokenizer, "chat_template", None):
        return tokenizer.apply_chat_template(conversation, tokenize=False, add_generation_prompt=False)
    return "\n".join(m["content"] for m in conversation)


def encode_texts(tokenizer: Any, texts: list[str], max_length: Optional[int] = None) -> dict[str, Tensor]:
    """``texts`` as a right-padded batch (``input_ids``, ``attention_mask`` [B, T]), cut from the left past
    ``max_length`` so the completion is kept; no special tokens added where a chat template wrote its own. One
    tokenization for scoring (:class:`RewardModelEnvironment`) and training a reward model
    (:func:`rlkit.stages.reward_model.train_reward_model`)."""
    side, truncation, tokenizer.padding_side, tokenizer.truncation_side = (tokenizer.padding_side,
                                                                           tokenizer.truncation_side, "right", "left")
    try:
        return dict(tokenizer(texts, return_tensors="pt", padding=True,
                              add_special_tokens=not getattr(tokenizer, "chat_template", None),
                              truncation=max_length is not None, max_length=max_length))
    finally:
        tokenizer.padding_side, tokenizer.truncation_side = side, truncation


class ScorerEnvironment(Environment):
    """Rewards ``scorer(texts)`` for batches of conversations rendered by ``tokenizer`` (see the module docstring)."""

    name = "scorer"

    def __init__(self, scorer: Scorer, tokenizer: Any = None, batch_size: int = 16, name: Optional[str] = None):
        if batch_size < 1:
            raise ValueError(f"batch_size must be >= 1, got {batch_size}")
        self.scorer, self.tokenizer, self.batch_size = scorer, tokenizer, batch_size
        self.name = name or self.name

    def step(self, conversations: list[Conversation], rows: list[dict[str, Any]]) -> EnvReturn:
        import torch

        check_batch(conversations, rows)
        texts = [conversation_text(self.tokenizer, c) for c in conversations]
        rewards, errors = [0.0] * len(texts), []
        for start in range(0, len(texts), self.batch_size):
            chunk = texts[start:start + self.batch_size]
            try:
                scores = torch.as_tensor(self.scorer(chunk), dtype=torch.float32).reshape(-1)
                if scores.numel() != len(chunk) or not torch.isfinite(scores).all():
                    raise ValueError(f"the scorer returned {scores.numel()} scores for {len(chunk)} texts "
                                     f"({'not all finite' if scores.numel() == len(chunk) else 'wrong count'})")
            except Exception as exc:  # noqa: BLE001 - a failed chunk costs its samples, not the batch
                errors += [sample_error(start + i, exc) for i in range(len(chunk))]
                continue
            rewards[start:start + len(chunk)] = scores.tolist()
        metadata = [{"score": r} for r in rewards]
        return EnvReturn.single_turn(rewards, metadata, errors)


class RewardModelEnvironment(ScorerEnvironment):
    """Rewards from an HF ``AutoModelForSequenceClassification`` with one label (a reward model), e.g.
    ``RewardModelEnvironment("models/my-rm")``; ``model``/``tokenizer`` may also be loaded objects."""

    name = "reward_model"

    def __init__(self, model: str | Path | Any, tokenizer: Any = None, batch_size: int = 16,
                 max_length: Optional[int] = None):
        import torch
        from transformers import AutoModelForSequenceClassification, AutoTokenizer

        if isinstance(model, (str, Path)):
            tokenizer = tokenizer if tokenizer is not None else AutoTokenizer.from_pretrained(str(model))
            model = AutoModelForSequenceClassification.from_pretrained(str(model), torch_dtype=torch.float32)
        if tokenizer is None:
            raise ValueError("pass the reward model's tokenizer (tokenizer=...) when model is a loaded model")
        if model.config.num_labels != 1:
            raise ValueError(f"a reward model has one output (num_labels=1); this one has {model.config.num_labels}. "
                             "Fix: load a reward model, or wrap a classifier's probability in ScorerEnvironment")
        if tokenizer.pad_token_id is None and model.config.pad_token_id is None:
            raise ValueError("the reward model's tokenizer has no pad token, so texts cannot be batched; set "
                             "tokenizer.pad_token and model.config.pad_token_id (e.g. to the EOS token)")
        if model.config.pad_token_id is None:  # transformers needs it to find each row's last token
            model.config.pad_token_id = tokenizer.pad_token_id
        self.model = model.float().eval()
        self.max_length = max_length
        super().__init__(self._score_texts, tokenizer, batch_size)

    def _score_texts(self, texts: list[str]) -> Tensor:  # [B] float32
        import torch

        enc = encode_texts(self.tokenizer, texts, self.max_length)
        device = next(self.model.parameters()).device
        with torch.no_grad():
            logits = self.model(input_ids=enc["input_ids"].to(device),
                                attention_mask=enc["attention_mask"].to(device)).logits
        return logits[:, 0].float().cpu()
