"""PPO's critic: a learned value of each state, for GAE (``grpo.advantage_estimator: gae``).

A value model (:mod:`rlkit.policy.value_model`: a causal-LM folder's decoder with a new one-output head per position)
on the backend ``critic.backend`` names: transformers' token-classification model in this process (``transformers``,
the default), or the policy's training backend in its layout (``policy``: Megatron-Core with tensor and sequence
parallelism, :mod:`rlkit.policy.megatron.value_head`; DTensor, FSDP2 over the ranks, :mod:`rlkit.policy.
dtensor_value_model`). fp32, its own AdamW. The value of the state *before* token
``t`` is the head's output at position ``t - 1`` (the same alignment as a token's logprob, which the logits at
``t - 1`` give), so ``values[:, t]`` pairs with ``logprobs[:, t]``; position 0 has none.

One update per RL step (:meth:`Critic.train_step`): the clipped value loss (:func:`rlkit.algorithms.returns.
clipped_value_loss`, verl's) against the GAE returns, over microbatches of rows, normalised by the batch's valid
tokens, then one optimizer step (gradients clipped by their global norm over the ranks, torch's rule).

Deliberate simplifications: every parameter trained, fp32, no dropout. A checkpoint holds its weights, its Adam state
and its step count (:meth:`Critic.save_state`, safetensors: no pickle; under tensor parallelism each rank's shards
under its own names, under FSDP each rank's local shards); a fork's parked branch holds its own copy (:meth:`Critic.capture`), so each branch's critic
learns from its own batches.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Optional

import torch
from torch import Tensor

from rlkit.algorithms.returns import clipped_value_loss
from rlkit.config.components import PolicyConfig
from rlkit.config.run import CriticConfig
from rlkit.policy.value_model import ValueModel, build_value_model, clip_gradients


@dataclass
class CriticState:
    """A critic's weights (``model/<name>``), AdamW's per-parameter state (``adam/<field>/<name>``) and step count."""

    tensors: dict[str, Tensor]
    version: int

    @property
    def nbytes(self) -> int:
        return sum(t.numel() * t.element_size() for t in self.tensors.values())


class Critic:
    """A value model over token ids [B, T] (see the module docstring)."""

    def __init__(self, folder: str | Path, cfg: CriticConfig, seed: int = 0, policy: Optional[PolicyConfig] = None):
        """The critic on ``folder`` (a causal-LM folder); ``policy``: the policy's config, read with
        ``critic.backend=policy`` (its backend and layout)."""
        self.value_model: ValueModel = build_value_model(cfg.backend, folder, bias=True, seed=seed, policy=policy)
        self.cfg = cfg
        self.optimizer = torch.optim.AdamW([p for _, p in self._named_parameters()], lr=cfg.lr, weight_decay=0.0)
        self.version = 0  # optimizer steps taken

    @property
    def model(self) -> torch.nn.Module:
        """The value model's module (train/eval, parameters)."""
        return self.value_model.module

    def _named_parameters(self) -> list[tuple[str, Tensor]]:
        return self.value_model.named_trained_parameters()

    def capture(self) -> CriticState:
        """A copy of the weights, AdamW's per-parameter state and the step count (a fork's parked branch, a
        checkpoint)."""
        names = {param: name for name, param in self._named_parameters()}
        tensors = {f"model/{name}": param.detach().clone() for name, param in self._named_parameters()}
        for param, state in self.optimizer.state.items():
            for key, value in state.items():
                tensors[f"adam/{key}/{names[param]}"] = torch.as_tensor(value).detach().clone()
        return CriticState(tensors, self.version)

    def restore(self, state: CriticState) -> None:
        """:meth:`capture`'s copy back into this critic (built on the same model folder): strict on names."""
        params = dict(self._named_parameters())
        saved = {k.split("/", 1)[1] for k in state.tensors if k.startswith("model/")}
        if saved != set(params):
            raise ValueError(f"the saved critic has other parameters than this one ({len(saved)} vs "
                             f"{len(params)}): it was saved from another critic.model_name")
        self.optimizer.state.clear()
        with torch.no_grad():
            for name, param in params.items():
                param.copy_(_placed_like(state.tensors[f"model/{name}"], param))
        for key, value in state.tensors.items():
            if key.startswith("adam/"):
                _, field, name = key.split("/", 2)
                param = params[name]
                self.optimizer.state[param][field] = (value if field == "step" else _placed_like(value, param)).clone()
        self.version = state.version

    def save_state(self, folder: Path) -> None:
        """:meth:`capture` into ``folder/critic.safetensors``."""
        from safetensors.torch import save_file

        folder.mkdir(parents=True, exist_ok=True)
        state = self.capture()
        save_file({k: _local(t).contiguous() for k, t in state.tensors.items()}, str(folder / "critic.safetensors"),
                  metadata={"version": str(state.version)})

    def load_state(self, folder: Path) -> None:
        """What :meth:`save_state` wrote, into this critic (built on the same model folder)."""
        from safetensors import safe_open

        with safe_open(str(folder / "critic.safetensors"), framework="pt") as f:
            self.restore(CriticState({k: f.get_tensor(k) for k in f.keys()}, int(f.metadata()["version"])))

    def use(self, cfg: CriticConfig) -> None:
        """Read the session's current ``critic.*`` (``configure()`` may have changed them): ``lr`` into the
        optimizer's groups (Adam's moments kept), ``value_clip``, ``micro_batch_size`` and ``max_grad_norm`` by the
        next call. ``enabled`` and ``model_name`` are not read here: changing them builds another critic."""
        self.cfg = cfg
        for group in self.optimizer.param_groups:
            group["lr"] = cfg.lr

    def _values(self, input_ids: Tensor, attention_mask: Tensor) -> Tensor:  # [b, t] -> [b, t], with grad
        out = self.value_model.head_values(input_ids, attention_mask)
        return torch.nn.functional.pad(out[:, :-1], (1, 0))

    @torch.no_grad()
    def values(self, input_ids: Tensor, attention_mask: Tensor, scored: Tensor) -> Tensor:
        """The values [B, T] (float32) of the states before the ``scored`` [B, T] tokens; 0 elsewhere."""
        self.model.eval()
        step = self.cfg.micro_batch_size
        chunks = [self._values(input_ids[i:i + step], attention_mask[i:i + step])
                  for i in range(0, input_ids.shape[0], step)]
        return torch.cat(chunks).float() * scored

    def train_step(self, input_ids: Tensor, attention_mask: Tensor, scored: Tensor, old_values: Tensor,
                   returns: Tensor) -> dict[str, float]:
        """One optimizer step on the clipped value loss of ``returns`` [B, T] around ``old_values`` [B, T] over the
        ``scored`` tokens; returns ``critic/value_loss``, ``critic/clip_fraction``, ``critic/grad_norm`` and the
        explained variance of the returns by the old values (``critic/explained_variance``)."""
        self.model.train()
        self.optimizer.zero_grad(set_to_none=True)
        tokens = int(scored.sum())
        loss_sum, clipped = 0.0, 0
        starts = range(0, input_ids.shape[0], self.cfg.micro_batch_size)
        for index, i in enumerate(starts):
            self.value_model.microbatch_starting(index, len(starts))
            rows = slice(i, i + self.cfg.micro_batch_size)
            predicted = self._values(input_ids[rows], attention_mask[rows])
            loss, n_clipped = clipped_value_loss(predicted, old_values[rows], returns[rows], scored[rows].float(),
                                                 self.cfg.value_clip, tokens)
            loss.backward()
            loss_sum, clipped = loss_sum + float(loss.detach()), clipped + int(n_clipped)
        self.value_model.reduce_grads()
        grad_norm = self.value_model.grad_norm()
        clip_gradients([p for _, p in self._named_parameters()], grad_norm, self.cfg.max_grad_norm)
        self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)
        self.version += 1
        on = scored.bool()
        residual = (returns - old_values)[on]
        explained = 1 - float(residual.var() / returns[on].var().clamp(min=1e-8)) if on.sum() > 1 else 0.0
        return {"critic/value_loss": loss_sum, "critic/clip_fraction": clipped / max(tokens, 1),
                "critic/grad_norm": grad_norm, "critic/explained_variance": explained}

    def export_hf_state(self) -> dict[str, Tensor]:
        """The critic's weights as full tensors under transformers' token-classification names (every rank calls)."""
        return self.value_model.export_hf_state()

    def close(self) -> None:
        if self.value_model is not None:
            self.value_model.close()
        self.value_model = self.optimizer = None


def _local(t: Tensor) -> Tensor:
    """This rank's part of ``t``: a DTensor's local shard (the DTensor value model's parameters), else ``t``."""
    return t.to_local() if hasattr(t, "to_local") else t


def _placed_like(t: Tensor, param: Tensor) -> Tensor:
    """``t`` (a captured tensor, or a loaded local shard) as ``param`` holds it: a local shard of a DTensor parameter
    wrapped in that parameter's mesh and placements."""
    if hasattr(param, "device_mesh") and not hasattr(t, "device_mesh"):
        from torch.distributed.tensor import DTensor

        local = _local(param)
        return DTensor.from_local(t.to(local.device, local.dtype), param.device_mesh, param.placements,
                                  shape=param.shape, stride=param.stride())
    return t
