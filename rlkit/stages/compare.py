"""Several losses on one batch, side by side, per token: ``session.compare_losses(batch, {"grpo": ..., "gspo": ...})``.

For each loss: its metrics, its gradient norm and, per token, what the token adds to the loss, its ratio, whether
a clip stopped its gradient, its advantage and KL term (:meth:`rlkit.algorithms.RLLoss.per_token`); between the
losses, the cosine of every pair of gradients. All at the current weights, from one forward pass for the
per-token maps and one backward pass per loss for the gradients; nothing is updated.

Why per token: GRPO, GSPO and CISPO differ in which tokens they clip and how they weight them, which a batch mean
hides; the token view coloured by one loss's contribution minus another's shows where they disagree.

Deliberate simplifications: gradients need the weights in this process (not the Ray worker group; there the
comparison has the per-token maps and no gradients); each gradient is held in fp32 while the pairs are compared.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Mapping, Optional

import pandas as pd
from torch import Tensor

from rlkit.notebook.html import fitted, table
from rlkit.policy.base import LossFn, Policy
from rlkit.policy.per_token import TokenLoss, evaluate_loss_per_token, trainer_logprobs
from rlkit.policy.snapshots import gradient
from rlkit.trajectories import Trajectories

COSINE_CAPTION = ("cosine of the gradients of each pair of losses at the current weights "
                  "(1: the same update direction, 0: unrelated, -1: opposite)")
LABEL_CHARS = 12  # a longer loss name is cut in the headers (the DataFrame keeps it whole)


def token_frame(batch: Trajectories, values: Mapping[str, Tensor], **constant: Any) -> Any:
    """A tidy DataFrame, one row per completion token: ``constant`` columns, ``sample``, ``position``, ``token``
    (the decoded token where the batch has a tokenizer, else its id) and one column per map of ``values`` [B, T]."""
    rows, cols = batch.loss_mask.nonzero(as_tuple=True)
    ids = batch.input_ids[rows, cols].tolist()
    tok = batch.tokenizer
    frame = {**{k: [v] * len(ids) for k, v in constant.items()}, "sample": rows.tolist(), "position": cols.tolist(),
             "token": [tok.decode([i]) for i in ids] if tok is not None else ids}
    frame.update({name: v[rows, cols].tolist() for name, v in values.items()})
    return pd.DataFrame(frame)


@dataclass(frozen=True)
class LossComparison:
    """The losses compared on one batch; ``table()`` and ``show()`` are the per-token views."""

    batch: Trajectories
    losses: dict[str, TokenLoss]  # name -> metrics and per-token maps
    grad_norms: dict[str, float] = field(default_factory=dict)  # name -> global gradient norm (empty: none)
    cosines: dict[tuple[str, str], float] = field(default_factory=dict)  # (a, b) -> cos(grad a, grad b), a before b

    def table(self) -> Any:
        """Tidy DataFrame: one row per (loss, completion token), columns ``loss_fn``, ``sample``, ``position``,
        ``token``, ``loss`` (the token's contribution), ``ratio``, ``clipped``, ``advantage``, ``kl``, ... ."""
        return pd.concat([token_frame(self.batch, t.values, loss_fn=name) for name, t in self.losses.items()],
                         ignore_index=True)

    def summary(self) -> Any:
        """One row per loss: its metrics and gradient norm."""
        return pd.DataFrame([{"loss_fn": name, **t.metrics, "grad_norm": self.grad_norms.get(name, float("nan"))}
                             for name, t in self.losses.items()]).set_index("loss_fn")

    def cosine_matrix(self) -> "CosineMatrix":
        """The gradient cosines as a symmetric DataFrame (1 on the diagonal), shown with a caption."""
        names = list(self.losses)
        get = lambda a, b: 1.0 if a == b else self.cosines.get((a, b), self.cosines.get((b, a), float("nan")))  # noqa: E731
        return CosineMatrix([[get(a, b) for b in names] for a in names], index=names, columns=names)

    def values(self, name: str, quantity: str = "loss") -> Tensor:
        """Loss ``name``'s per-token map ``quantity`` [B, T]."""
        return self.losses[name].values[quantity]

    def show(self, name: str, color: str = "loss", minus: Optional[str] = None, rows: Any = 8) -> Any:
        """The token view of loss ``name`` coloured by its map ``color``; with ``minus``, by that map of ``name``
        minus the same map of loss ``minus`` (where the two disagree)."""
        values = self.values(name, color) - (self.values(minus, color) if minus else 0)
        label = f"{name} {color}" + (f" - {minus} {color}" if minus else "")
        return self.batch.show(values, rows=rows, label=label)

    def __repr__(self) -> str:
        parts = [f"{n}: loss={t.metrics.get('loss', float('nan')):.4g}"
                 + (f", grad_norm={self.grad_norms[n]:.4g}" if n in self.grad_norms else "")
                 for n, t in self.losses.items()]
        cos = ", ".join(f"cos({a},{b})={c:.3f}" for (a, b), c in self.cosines.items())
        return "LossComparison(" + "; ".join(parts) + (f"; {cos}" if cos else "") + ")"

    def _repr_html_(self) -> str:
        summary = self.summary()  # one column per loss, one row per metric: as narrow as the number of losses
        rows = [[metric, *summary[metric]] for metric in summary.columns]
        per_loss = table(["", *map(_label, summary.index)], rows,
                         "per loss at the current weights: its metrics and gradient norm")
        return fitted(per_loss) + (self.cosine_matrix()._repr_html_() if self.cosines else "")


class CosineMatrix(pd.DataFrame):
    """The gradient cosines' DataFrame; in a notebook, a compact table with a caption saying what the numbers are."""

    @property
    def _constructor(self) -> type:
        return pd.DataFrame  # a slice or a sum of it is a plain DataFrame

    def _repr_html_(self) -> str:
        rows = [[_label(a), *(f"{c:.3f}" for c in self.loc[a])] for a in self.index]
        return fitted(table(["", *map(_label, self.columns)], rows, COSINE_CAPTION))


def _label(name: Any) -> str:
    """A loss name as a header: cut to :data:`LABEL_CHARS` characters."""
    text = str(name)
    return text if len(text) <= LABEL_CHARS else text[:LABEL_CHARS - 1] + "\u2026"


def compare_losses(batch: Trajectories, policy: Policy, losses: Mapping[str, LossFn],
                   gradients: bool = True) -> LossComparison:
    """Every loss of ``losses`` on ``batch`` at the policy's current weights (see the module docstring); with
    ``gradients`` (and weights in this process) also each loss's gradient norm and the pairwise cosines."""
    logprobs = trainer_logprobs(policy, batch)
    tokens = {name: evaluate_loss_per_token(policy, batch, fn, logprobs) for name, fn in losses.items()}
    if not gradients or getattr(policy, "model", None) is None:
        return LossComparison(batch, tokens)
    grads = {name: gradient(policy, batch, fn) for name, fn in losses.items()}
    names = list(grads)
    cosines = {(a, b): grads[a].cosine(grads[b]) for i, a in enumerate(names) for b in names[i + 1:]}
    return LossComparison(batch, tokens, {n: g.norm for n, g in grads.items()}, cosines)
