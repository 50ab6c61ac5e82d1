"""The PyTorch-native policy: a transformers causal LM sharded with FSDP2 (``fully_shard``) over a DTensor mesh.

Why a second backend: it trains transformers' own implementation of the model, with no weight conversion
(the HF names are the parameter names), and it is the baseline the Megatron backend is measured against. Its
adapter is the plain transformers one (:class:`rlkit.policy.hf.HFAdapter`: HF weights in and out, full-vocabulary
logprobs, the gradient norm) sharded, under the same training loop as the Megatron one
(:class:`rlkit.policy.in_process.InProcessPolicy`), so a notebook switches with ``policy.backend=dtensor`` and
compares.

What is particular here: gradients *summed* over data-parallel ranks by FSDP itself (its default average is
switched off, because the loss is already a global-batch value), reduce-scattered once per step.

Precision (``policy.precision``): float32, or bfloat16 through FSDP2's ``MixedPrecisionPolicy``: the sharded
parameters stay fp32 (the master weights AdamW updates, with fp32 state), each unit gathers them in bf16
for forward and backward, gradients are reduce-scattered in fp32, and logits are cast to fp32 before the
log-softmax. Pure bf16 (``policy.optimizer.main_params_dtype=bfloat16``): the model is loaded in bf16 and its
sharded bf16 parameters, gradients and AdamW state are all there is.

Deliberate simplifications: one data-parallel mesh dimension (no tensor or context parallelism), each
decoder layer one FSDP unit, the full vocabulary's log-softmax per microbatch, dense models only.
"""

from __future__ import annotations

import torch
import torch.distributed as dist

from rlkit.config.components import PolicyConfig
from rlkit.policy.hf import HFAdapter, load_causal_lm
from rlkit.policy.in_process import InProcessPolicy
from rlkit.policy.precision import fsdp_mixed_precision
from rlkit.policy.process_group import acquire_process_group


def shard_summing_gradients(model: torch.nn.Module, layers, mesh, mp_policy=None) -> None:
    """FSDP2 over ``mesh`` in place: each of ``layers`` (the decoder layers) one unit, ``model`` the root unit (its
    other parameters), each unit's gradients *summed* over the ranks in one plain SUM reduce-scatter."""
    from torch.distributed.fsdp import FSDPModule, MixedPrecisionPolicy, fully_shard

    mp_policy = mp_policy or MixedPrecisionPolicy()
    for layer in layers:
        fully_shard(layer, mesh=mesh, mp_policy=mp_policy)
    # The root too reshards after each forward: otherwise its parameters stay unsharded plain tensors after
    # a no-grad pass, and the reference swap and checkpoints would meet them instead of DTensors.
    fully_shard(model, mesh=mesh, reshard_after_forward=True, mp_policy=mp_policy)
    for module in model.modules():
        if isinstance(module, FSDPModule):  # each FSDP unit keeps its own reduction settings
            module.set_gradient_divide_factor(1.0)  # sum over ranks: the loss is already a global value
            module.set_force_sum_reduction_for_comms(True)  # plain SUM (gloo has no AVG / PREMUL_SUM)


def DTensorPolicy(cfg: PolicyConfig, seed: int = 0) -> InProcessPolicy:  # the loop over a DTensorAdapter
    return InProcessPolicy(DTensorAdapter(cfg, seed))


class DTensorAdapter(HFAdapter):
    """A causal LM from an HF folder, FSDP2-sharded over all ranks."""

    def __init__(self, cfg: PolicyConfig, seed: int = 0):
        from torch.distributed.device_mesh import init_device_mesh

        self._setup(cfg)
        acquire_process_group()
        self.holds_process_group = True
        self.dp_rank, self.dp_size = dist.get_rank(), dist.get_world_size()
        self.mesh = init_device_mesh(self.device.type, (self.dp_size,), mesh_dim_names=("dp",))
        torch.manual_seed(seed)
        model = self._with_adapters(load_causal_lm(cfg, self.device, cfg.dtensor_cfg.activation_checkpointing))
        shard_summing_gradients(model, model.model.layers, self.mesh, fsdp_mixed_precision(cfg.precision,
                                                                                             cfg.pure_bf16))
        self.model = model

    def parallel_layout(self) -> dict[str, int | str]:
        return {"backend": "dtensor", "data_parallel_size": self.dp_size}

    def rows_group(self):
        return dist.group.WORLD

    def microbatch_starting(self, index: int, count: int) -> None:
        self.model.set_requires_gradient_sync(index == count - 1)  # reduce-scatter once, after the last backward

    def __repr__(self) -> str:
        a = self.arch
        return (f"DTensorAdapter({a.family}, {a.num_layers}x{a.hidden_size}, {self.cfg.precision}, FSDP2 over "
                f"{self.dp_size} rank(s))")
