"""A value model: a decoder with one scalar per position instead of a vocabulary, on the backend a config chooses.

PPO's critic (:mod:`rlkit.policy.critic`) and reward-model training (:mod:`rlkit.stages.reward_model`) both train one:
the decoder of a causal-LM folder, its LM head replaced by a linear ``[1, hidden]`` head (with a bias for the critic,
as transformers' token-classification head; without for a reward model, as its sequence-classification head) after
the final norm. Both read the head's output per position and differ only in which positions they use (the critic:
every state; a reward model: each row's last real token) and in their loss.

Where it runs is one key, ``critic.backend`` / ``reward_model.backend`` (:data:`ValueBackendName`):

- ``transformers``: transformers' own classification model in this process (one process, every parameter trained);
- ``policy``: the policy's training backend with its layout, through :data:`POLICY_BACKEND_VALUE_MODELS` (this
  module's registry, keyed by ``policy.backend``): Megatron-Core's ``GPTModel`` with a scalar head
  (:mod:`rlkit.policy.megatron.value_head`: tensor and sequence parallel, the policy's HF conversion), for the
  ``dtensor`` backend transformers' model above sharded with FSDP2 over the ranks of the policy's process group
  (:mod:`rlkit.policy.dtensor_value_model`: the ranks split each call's rows), and for the ``hf`` backend
  transformers' model as above. A value model runs in the driver's process: beside an in-process policy in its
  layout, beside a policy in Ray workers in one process's (:func:`beside_the_policy`), where FSDP2 over one rank
  computes what ``transformers`` does.

Every implementation is fp32 and holds the whole model trained (no adapters, no bf16 copy). One interface,
:class:`ValueModel`; the training loops (the critic's step, the reward model's) are written against it once.
"""

from __future__ import annotations

from pathlib import Path
from typing import Callable, Iterator, Optional, Protocol

import torch
from torch import Tensor

from rlkit.config.components import PolicyConfig
from rlkit.config.run import ValueBackendName
from rlkit.errors import ConfigError
from rlkit.policy.transformers_value_model import TransformersValueModel


class ValueModel(Protocol):
    """A decoder with a scalar head, built and loaded (see the module docstring)."""

    module: torch.nn.Module  # train()/eval() switch it; what the optimizer's parameters belong to

    def head_values(self, input_ids: Tensor, attention_mask: Tensor) -> Tensor:
        """input_ids, attention_mask [b, t] (right-padded) -> the head's output [b, t] (fp32, on the ids' device,
        differentiable) at each position, reading that position and the ones before it."""

    def named_trained_parameters(self) -> list[tuple[str, Tensor]]:
        """This rank's trained parameters under names unique on it (what AdamW steps and a capture saves)."""

    def microbatch_starting(self, index: int, count: int) -> None:
        """Called before the backward of microbatch ``index`` of ``count``."""

    def reduce_grads(self) -> None:
        """Gradients complete in each parameter's ``.grad`` (summed over ranks that hold the same weights)."""

    def grad_norm(self) -> float:
        """The global gradient norm over every rank's (sharded) gradients."""

    def export_hf_state(self) -> dict[str, Tensor]:
        """Full tensors under transformers' classification-model names (``model.*``, ``score.weight`` and with a bias
        ``score.bias``); every rank calls (gathers)."""

    def close(self) -> None:
        """Release the model (and a hold on Megatron's parallel state)."""


ValueModelBuilder = Callable[[PolicyConfig, str, bool, int], ValueModel]


def _megatron(policy: PolicyConfig, folder: str, bias: bool, seed: int) -> ValueModel:
    from rlkit.policy.megatron.value_head import MegatronValueModel

    return MegatronValueModel(policy, folder, bias, seed)


def _hf(policy: PolicyConfig, folder: str, bias: bool, seed: int) -> ValueModel:
    return TransformersValueModel(folder, bias, seed)


def _dtensor(policy: PolicyConfig, folder: str, bias: bool, seed: int) -> ValueModel:
    from rlkit.policy.dtensor_value_model import DTensorValueModel

    return DTensorValueModel(policy, folder, bias, seed)


# the value model of each training backend (policy.backend) that has one
POLICY_BACKEND_VALUE_MODELS: dict[str, ValueModelBuilder] = {"megatron": _megatron, "dtensor": _dtensor, "hf": _hf}


def _transformers(folder: str | Path, bias: bool, seed: int, policy: Optional[PolicyConfig], key: str) -> ValueModel:
    return TransformersValueModel(folder, bias, seed)


def _on_the_policys_backend(folder: str | Path, bias: bool, seed: int, policy: Optional[PolicyConfig],
                            key: str) -> ValueModel:
    if policy is None:
        raise ValueError(f"{key}=policy needs the policy's config (the backend and layout the value model takes)")
    builder = POLICY_BACKEND_VALUE_MODELS.get(policy.backend)
    if builder is None:
        raise ConfigError([f"{key}=policy: the {policy.backend} backend has no value model yet (built: "
                           f"{', '.join(sorted(POLICY_BACKEND_VALUE_MODELS))}). Fix: {key}=transformers, or "
                           f"policy.backend=megatron"])
    return builder(policy, str(folder), bias, seed)


# each value ``critic.backend`` / ``reward_model.backend`` takes (rlkit.config.run.VALUE_BACKEND_ON_POLICY's keys)
VALUE_BACKENDS: dict[str, Callable[..., ValueModel]] = {"transformers": _transformers,
                                                        "policy": _on_the_policys_backend}


def build_value_model(backend: ValueBackendName, folder: str | Path, *, bias: bool, seed: int = 0,
                      policy: Optional[PolicyConfig] = None, key: str = "critic.backend") -> ValueModel:
    """The value model on ``folder`` (a causal-LM folder) for ``backend`` (``policy``: ``policy``'s backend and
    layout). ``key`` names the setting in errors."""
    return VALUE_BACKENDS[backend](folder, bias, seed, policy, key)


def beside_the_policy(policy: PolicyConfig) -> PolicyConfig:
    """``policy``'s settings for a value model in this (the driver's) process: its layout when the policy is in this
    process too; one process's (no model parallelism) when the policy runs in Ray workers, as the teacher's."""
    if policy.num_workers == 1:
        return policy
    section = policy.backend_section
    return policy.model_copy(update={"num_workers": 1, "ray_address": None,
                                     f"{section.name}_cfg": section.single_process()})


def clip_gradients(params: Iterator[Tensor] | list[Tensor], norm: float, max_norm: Optional[float]) -> None:
    """Scale the gradients of ``params`` by ``max_norm / (norm + 1e-6)`` when that is below 1 (torch's
    ``clip_grad_norm_`` rule, with the global ``norm`` every rank agrees on)."""
    if max_norm is None:
        return
    coef = max_norm / (norm + 1e-6)
    if coef < 1.0:
        for p in params:
            if p.grad is not None:
                p.grad.mul_(coef)
