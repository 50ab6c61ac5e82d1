"""The value model in transformers' own classes (:class:`rlkit.policy.value_model.ValueModel`, in one process), and
the two pieces the DTensor value model shares with it: the head's output at every position and the gradient norm.
Kept apart from :mod:`rlkit.policy.value_model` (the protocol and the registry) so that the backends' modules import
it without importing the registry that imports them."""

from __future__ import annotations

from pathlib import Path
from typing import Iterable

import torch
from torch import Tensor


class TransformersValueModel:
    """transformers' classification model with one output on a causal-LM folder, in this process, fp32: the
    token-classification model (a ``score`` head with a bias) or with ``bias=False`` the sequence-classification one
    (``score`` without). Dropout is off (transformers puts 0.1 before a token-classification head by default): the
    value loss compares the values it trains with values computed in eval mode, as verl's critic does."""

    def __init__(self, folder: str | Path, bias: bool = True, seed: int = 0):
        from transformers import AutoConfig, AutoModelForSequenceClassification, AutoModelForTokenClassification
        from transformers.utils import logging as hf_logging

        torch.manual_seed(seed)
        kind = AutoModelForTokenClassification if bias else AutoModelForSequenceClassification
        verbosity = hf_logging.get_verbosity()
        hf_logging.set_verbosity_error()  # "some weights were newly initialized": the head, as intended
        try:
            config = AutoConfig.from_pretrained(str(folder), num_labels=1)
            if bias:
                config.classifier_dropout = 0.0
            self.model = kind.from_pretrained(str(folder), config=config, dtype=torch.float32)
        finally:
            hf_logging.set_verbosity(verbosity)
        self.module = self.model

    def head_values(self, input_ids: Tensor, attention_mask: Tensor) -> Tensor:
        return values_at_every_position(self.model, input_ids, attention_mask)

    def named_trained_parameters(self) -> list[tuple[str, Tensor]]:
        return list(self.model.named_parameters())

    def microbatch_starting(self, index: int, count: int) -> None:
        pass

    def reduce_grads(self) -> None:
        pass  # one process: the gradients are whole

    def grad_norm(self) -> float:
        return global_grad_norm(self.model.parameters())

    def export_hf_state(self) -> dict[str, Tensor]:
        return {name: t.detach() for name, t in self.model.state_dict().items()}

    def close(self) -> None:
        self.model = self.module = None


def values_at_every_position(classifier: torch.nn.Module, input_ids: Tensor, attention_mask: Tensor) -> Tensor:
    """A transformers classification model's (or a module with its ``model`` and ``score``) head output [b, t] (fp32)
    at every position of ``input_ids`` [b, t]: its own forward pools a sequence classifier's at one position."""
    hidden = classifier.model(input_ids=input_ids, attention_mask=attention_mask.long()).last_hidden_state
    return classifier.score(hidden)[..., 0].float()


def global_grad_norm(params: Iterable[Tensor]) -> float:
    """The 2-norm of the gradients of ``params`` (plain tensors, or DTensor shards: then over every rank's)."""
    grads = [p.grad for p in params if p.grad is not None]
    if not grads:
        return 0.0
    norm = torch.nn.utils.get_total_norm(grads)
    return float(norm.full_tensor() if hasattr(norm, "full_tensor") else norm)
