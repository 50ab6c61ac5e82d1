"""A value model on the DTensor backend (:class:`rlkit.policy.value_model.ValueModel`, for PPO's critic and
reward-model training): transformers' classification model, built as :class:`rlkit.policy.transformers_value_model.
TransformersValueModel` builds it, sharded with FSDP2 (``fully_shard``) per decoder layer and at the root over every
rank of the default process group (rlkit's, :mod:`rlkit.policy.process_group`, as the DTensor policy's).

The ranks split the rows. The callers (the critic's step, the reward model's) pass the whole batch on every rank and
normalise its loss by the whole batch, as under Megatron's tensor parallelism; here each call's rows are dealt out in
equal contiguous shares (the last rows padded with copies of the first, whose values are dropped), each rank runs its
share, and the head's outputs are all-gathered into the whole [b, t] on every rank by a gather whose backward keeps
this rank's rows of the gradient alone (every rank computes the same loss from the whole, so that gradient is already
complete: Megatron's sequence-parallel gather does the same). Each rank's parameter gradients are then its rows' part of
the whole loss's, and FSDP *sums* them over the ranks (its average switched off, as for the DTensor policy) in one
reduce-scatter after the last microbatch's backward.

Deliberate simplifications: fp32 and every weight trained (``policy.precision`` and adapters are the policy's alone),
one FSDP unit per decoder layer, dense models only. The parameters are the FSDP shards (DTensors) under transformers'
names; the export gathers them whole.
"""

from __future__ import annotations

import torch
import torch.distributed as dist
from torch import Tensor

from rlkit.config.components import PolicyConfig
from rlkit.policy.dtensor import shard_summing_gradients
from rlkit.policy.process_group import acquire_process_group, release_process_group
from rlkit.policy.transformers_value_model import TransformersValueModel, global_grad_norm, values_at_every_position


class _PerPosition(torch.nn.Module):
    """A classification model's decoder (``model``) and head (``score``) under its names, whose forward is the head's
    output at every position (the model's own forward pools a sequence classifier's at one): FSDP's root, whose
    forward gathers the embedding, final norm and head."""

    def __init__(self, classifier: torch.nn.Module):
        super().__init__()
        self.model, self.score = classifier.model, classifier.score

    def forward(self, input_ids: Tensor, attention_mask: Tensor) -> Tensor:  # [b, t] -> [b, t]
        return values_at_every_position(self, input_ids, attention_mask).clone()  # (FSDP warns of a view out)


class _GatherRows(torch.autograd.Function):
    """Each rank's [r, t] -> every rank's, in rank order [size * r, t]; backward: this rank's rows of the gradient."""

    @staticmethod
    def forward(ctx, local: Tensor, rank: int, size: int) -> Tensor:
        local = local.contiguous()
        parts = [torch.empty_like(local) for _ in range(size)]
        dist.all_gather(parts, local)
        ctx.rows, ctx.rank = local.shape[0], rank
        return torch.cat(parts)

    @staticmethod
    def backward(ctx, grad: Tensor):
        return grad[ctx.rank * ctx.rows:(ctx.rank + 1) * ctx.rows], None, None


class DTensorValueModel:
    """A :class:`rlkit.policy.value_model.ValueModel` sharded with FSDP2 over every rank (module docstring)."""

    def __init__(self, policy: PolicyConfig, folder: str, bias: bool = True, seed: int = 0):
        from torch.distributed.device_mesh import init_device_mesh

        acquire_process_group()
        self.rank, self.size = dist.get_rank(), dist.get_world_size()
        self.device = (torch.device("cuda", torch.cuda.current_device()) if torch.cuda.is_available()
                       else torch.device("cpu"))
        try:
            classifier = TransformersValueModel(folder, bias, seed).model.to(self.device)
            if policy.dtensor_cfg.activation_checkpointing:
                classifier.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
            model = _PerPosition(classifier)
            shard_summing_gradients(model, model.model.layers, init_device_mesh(self.device.type, (self.size,)))
        except BaseException:
            release_process_group()
            raise
        self.module = model

    def head_values(self, input_ids: Tensor, attention_mask: Tensor) -> Tensor:
        """input_ids, attention_mask [b, t] (the whole batch, the same on every rank) -> [b, t] on every rank."""
        b = input_ids.shape[0]
        share = -(-b // self.size)
        fill = torch.zeros(share * self.size - b, dtype=torch.long)  # padding rows: copies of row 0
        rows = torch.cat([torch.arange(b), fill])[self.rank * share:(self.rank + 1) * share].to(input_ids.device)
        local = self.module(input_ids[rows].to(self.device), attention_mask[rows].to(self.device))
        return _GatherRows.apply(local, self.rank, self.size)[:b].to(input_ids.device)

    def named_trained_parameters(self) -> list[tuple[str, Tensor]]:
        return list(self.module.named_parameters())

    def microbatch_starting(self, index: int, count: int) -> None:
        self.module.set_requires_gradient_sync(index == count - 1)  # reduce-scatter once, after the last backward

    def reduce_grads(self) -> None:
        pass  # FSDP reduce-scattered them in the last microbatch's backward

    def grad_norm(self) -> float:
        return global_grad_norm(self.module.parameters())

    def export_hf_state(self) -> dict[str, Tensor]:
        return {name: t.detach().full_tensor() if hasattr(t, "full_tensor") else t.detach().clone()
                for name, t in self.module.state_dict().items()}

    def close(self) -> None:
        if self.module is not None:
            self.module = None
            release_process_group()

    def __repr__(self) -> str:
        return f"DTensorValueModel(FSDP2 over {self.size} rank(s), {self.device})"
