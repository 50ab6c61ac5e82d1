"""Tinker datums <-> rlkit's ``Trajectories``, and per-token results back to per-datum arrays.

A Tinker datum is ``model_input`` (N tokens) with ``loss_fn_inputs`` aligned to it: position ``i`` of
``target_tokens`` is the token that follows ``model_input[i]``. rlkit scores the tokens of one sequence: its
``logprobs[t]`` is ``log p(input_ids[t] | input_ids[:t])``. So a datum whose targets are its input shifted by one
(``target_tokens[:-1] == model_input[1:]``, the way every Tinker recipe builds them) is the rlkit row
``model_input + [target_tokens[-1]]`` (N + 1 tokens), and Tinker's position ``i`` is rlkit's ``i + 1``. Every
target position is in the loss mask (so the logprobs of all N come back); the per-token coefficient (the
cross-entropy ``weights`` or the RL ``advantages``) goes to ``advantages``, the sampler's ``logprobs`` to
``generator_logprobs`` (0 for cross-entropy), and the loss name and ``loss_fn_config`` to each row's
``env_metadata`` (:mod:`rlkit.tinker_api.losses`).

Deliberate simplifications: a datum whose targets are not its input shifted by one (arbitrary targets at a
position) is refused, as are 2-D (top-k) targets; rewards are 0 (Tinker sends none), so a step's
``rollout/reward_mean`` reads 0.
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass, field
from typing import Mapping, Sequence

import numpy as np
import torch

from rlkit.algorithms import token_mult_prob_error
from rlkit.tinker_api.losses import (CONFIG_KEY, COEFFICIENT, LOSS_INPUTS, LOSS_KEY, NOT_SERVED, RATIO_MASK_KEY,
                                     REQUIRED_CONFIG, TINKER_LOSSES)
from rlkit.trajectories import Trajectories


class TinkerRequestError(ValueError):
    """A request the service cannot serve, said in the SDK's words (it becomes a failed future or a 400)."""


@dataclass(frozen=True)
class Datum:
    """One Tinker datum as the wire carries it: input tokens and the named per-token inputs of its loss."""

    tokens: tuple[int, ...]  # [N] model_input
    inputs: Mapping[str, np.ndarray] = field(default_factory=dict)  # name -> [N] (target_tokens, weights, ...)


def check_loss(loss_fn: str, loss_fn_config: Mapping[str, float]) -> None:
    """Refuse a loss the service does not compute, or a config it would have to guess a value for."""
    if loss_fn not in TINKER_LOSSES:
        why = f" ({NOT_SERVED[loss_fn]})" if loss_fn in NOT_SERVED else ""
        raise TinkerRequestError(f"loss_fn {loss_fn!r} is not implemented by rlkit's Tinker service{why}; it serves "
                                 f"{', '.join(TINKER_LOSSES)}")
    missing = [k for k in REQUIRED_CONFIG.get(loss_fn, ()) if k not in loss_fn_config]
    if missing:
        example = ", ".join(f"{k!r}: ..." for k in missing)
        raise TinkerRequestError(f"loss_fn {loss_fn!r} needs loss_fn_config keys {missing}: Tinker's loss docs state no "
                                 f"default, so rlkit's service does not guess one; pass loss_fn_config={{{example}}}")


def _row(datum: Datum, index: int, loss_fn: str) -> tuple[list[int], dict[str, np.ndarray]]:
    """The rlkit row (N + 1 tokens) of ``datum`` and its loss inputs, checked."""
    n = len(datum.tokens)
    missing = [k for k in ("target_tokens", *LOSS_INPUTS[loss_fn]) if k not in datum.inputs
               and not (k == "weights" and "target_tokens" in datum.inputs)]
    if missing:
        raise TinkerRequestError(f"datum {index}: loss_fn {loss_fn!r} needs loss_fn_inputs {missing}")
    inputs = {k: np.asarray(v) for k, v in datum.inputs.items()}
    per_datum_clip = sorted(k for k in inputs if k.startswith("clip_"))
    if per_datum_clip:
        raise TinkerRequestError(f"datum {index}: loss_fn_inputs {per_datum_clip} (per-datum clip thresholds) are not "
                                 "served; pass the thresholds in forward_backward's loss_fn_config")
    for name, value in inputs.items():
        if value.ndim != 1 or value.shape[0] != n:
            raise TinkerRequestError(f"datum {index}: loss_fn_inputs[{name!r}] has shape {list(value.shape)}, but "
                                     f"model_input has {n} tokens: rlkit's service takes one value per input token")
    targets = inputs["target_tokens"].astype(np.int64)
    if n == 0:
        raise TinkerRequestError(f"datum {index}: model_input is empty")
    if not np.array_equal(targets[:-1], np.asarray(datum.tokens[1:], dtype=np.int64)):
        raise TinkerRequestError(
            f"datum {index}: target_tokens are not model_input shifted by one token (target_tokens[i] == "
            "model_input[i + 1]); rlkit's service scores one sequence's own next tokens, so build the datum from "
            "the full sequence: model_input = seq[:-1], target_tokens = seq[1:]")
    inputs.setdefault("weights", np.ones(n, dtype=np.float32))
    if "sequence_ratio_mask" in LOSS_INPUTS[loss_fn] and not np.any(inputs["sequence_ratio_mask"] != 0):
        raise TinkerRequestError(f"datum {index}: sequence_ratio_mask marks no token, so {loss_fn}'s sequence ratio "
                                 "(a mean over the marked tokens) is undefined; mark the sampled tokens")
    return [*datum.tokens, int(targets[-1])], inputs


def datums_to_batch(datums: Sequence[Datum], loss_fn: str, loss_fn_config: Mapping[str, float],
                    pad_token_id: int, policy_version: int) -> Trajectories:
    """The batch of ``datums`` for rlkit's stages: one row per datum, right-padded (N + 1 tokens each)."""
    check_loss(loss_fn, loss_fn_config)
    if not datums:
        raise TinkerRequestError("no data: forward_backward needs at least one datum")
    rows = [_row(d, i, loss_fn) for i, d in enumerate(datums)]
    width = max(len(tokens) for tokens, _ in rows)
    b = len(rows)
    input_ids = torch.full((b, width), pad_token_id, dtype=torch.int64)
    attention_mask = torch.zeros((b, width), dtype=torch.bool)
    loss_mask = torch.zeros((b, width), dtype=torch.bool)
    coefficient = torch.zeros((b, width), dtype=torch.float32)
    sampler = torch.zeros((b, width), dtype=torch.float32)
    for i, (tokens, inputs) in enumerate(rows):
        n = len(tokens) - 1
        input_ids[i, :n + 1] = torch.tensor(tokens)
        attention_mask[i, :n + 1] = True
        loss_mask[i, 1:n + 1] = True
        coefficient[i, 1:n + 1] = torch.from_numpy(inputs[COEFFICIENT[loss_fn]].astype(np.float32))
        if "logprobs" in LOSS_INPUTS[loss_fn]:
            sampler[i, 1:n + 1] = torch.from_numpy(inputs["logprobs"].astype(np.float32))
    meta = [{LOSS_KEY: loss_fn, CONFIG_KEY: dict(loss_fn_config)} for _ in rows]
    if "sequence_ratio_mask" in LOSS_INPUTS[loss_fn]:
        for m, (_, inputs) in zip(meta, rows):
            m[RATIO_MASK_KEY] = tuple(bool(v) for v in inputs["sequence_ratio_mask"] != 0)
    return Trajectories(prompts=("",) * b, completions=("",) * b, input_ids=input_ids, attention_mask=attention_mask,
                        loss_mask=loss_mask, generator_logprobs=sampler, finish_reasons=("stop",) * b, group_size=1,
                        policy_version=policy_version, rewards=torch.zeros(b), advantages=coefficient,
                        env_metadata=tuple(meta), info={"tinker/loss_fn": loss_fn})


def per_datum(values: torch.Tensor, batch: Trajectories) -> list[np.ndarray]:
    """``values`` [B, T] (aligned with rlkit's tokens) as one float32 array [N] per datum, in Tinker's positions."""
    return [values[i, 1:int(batch.attention_mask[i].sum())].detach().to(torch.float32).numpy()
            for i in range(batch.batch_size)]


MISMATCH_KEYS = ("token_mult_prob_error", "logprob_abs_diff_max", "logprob_abs_diff_mean")


def sampled_mismatch(batch: Trajectories, threshold: float) -> Trajectories:
    """``batch`` (after the logprobs stage) with the generator/trainer mismatch figures taken over the sampled
    tokens only, and the stage's warning on those. A Tinker datum carries the sampler's ``logprobs`` at every
    position, 0 where nothing was sampled (the prompt, by every recipe's convention, with advantage 0 there), so
    the stage's figure over all positions compares the trainer's prompt logprobs with 0 and reads as a broken refit
    (a cookbook RL recipe: token_mult_prob_error ~4e4 at every step). Sampled = a nonzero sampler logprob; a
    cross-entropy batch has none, so it gets no figure."""
    info = {k: v for k, v in batch.info.items() if k not in MISMATCH_KEYS}
    sampled = batch.loss_mask & (batch.generator_logprobs != 0)
    if sampled.any():
        error = token_mult_prob_error(batch.prev_logprobs, batch.generator_logprobs, sampled)
        diff = (batch.prev_logprobs - batch.generator_logprobs).abs()[sampled]
        info.update(token_mult_prob_error=error, logprob_abs_diff_max=float(diff.max()),
                    logprob_abs_diff_mean=float(diff.mean()))
        if error - 1.0 > threshold:
            warnings.warn(f"generator and trainer logprobs disagree on the sampled tokens: token_mult_prob_error="
                          f"{error:.4f} (is the sampler's client older than the latest save_weights_for_sampler?)",
                          stacklevel=2)
    return batch.with_(info=info)
