"""The PyTorch-native policy: a transformers causal LM sharded with FSDP2 (``fully_shard``) over a DTensor mesh.

Why a second backend: it trains transformers' own implementation of the model, with no weight conversion
(the HF names are the parameter names), and it is the baseline the Megatron backend is measured against. It
shares everything but the model with :class:`rlkit.policy.megatron.policy.MegatronPolicy`
(:class:`rlkit.policy.in_process.InProcessPolicy`), so a notebook switches with
``policy.dtensor_cfg.enabled=true`` and compares.

What is particular here: logprobs by log-softmax and gather over the full vocabulary, and gradients
*summed* over data-parallel ranks by FSDP itself (its default average is switched off, because the loss is
already a global-batch value).

Precision (``policy.precision``): float32, or bfloat16 through FSDP2's ``MixedPrecisionPolicy``: the sharded
parameters stay fp32 (the master weights AdamW updates, with fp32 state), each unit gathers them in bf16
for forward and backward, gradients are reduce-scattered in fp32, and logits are cast to fp32 before the
log-softmax.

Deliberate simplifications: one data-parallel mesh dimension (no tensor or context parallelism), each
decoder layer one FSDP unit, the full vocabulary's log-softmax per microbatch, dense models
only (transformers 5 holds Mixtral's experts fused under names that differ from the checkpoint's).
"""

from __future__ import annotations

import re
from typing import Iterator, Mapping

import torch
import torch.distributed as dist
from torch import Tensor

from rlkit.config.components import PolicyConfig
from rlkit.errors import ModelError
from rlkit.policy.in_process import InProcessPolicy
from rlkit.policy.megatron.build import Architecture
from rlkit.policy.megatron.parallel import acquire_process_group
from rlkit.policy import packed_attention
from rlkit.policy.packing import PackedRows
from rlkit.policy.precision import fsdp_mixed_precision
from rlkit.weights import HFGroup

_LAYER = re.compile(r"^model\.layers\.(\d+)\.")


class DTensorPolicy(InProcessPolicy):
    """A causal LM from an HF folder, FSDP2-sharded over all ranks (implements :class:`rlkit.policy.base.Policy`)."""

    def __init__(self, cfg: PolicyConfig, seed: int = 0):
        from torch.distributed.device_mesh import init_device_mesh
        from torch.distributed.fsdp import FSDPModule, fully_shard
        from transformers import AutoModelForCausalLM

        self.cfg = cfg
        self.arch = Architecture.from_hf_folder(cfg.model_name)
        if self.arch.family == "mixtral":
            raise ModelError("the DTensor backend does not train Mixture-of-Experts models yet (transformers holds the "
                             "experts fused, under other names than the checkpoint's); use policy.megatron_cfg")
        acquire_process_group()
        self._holds_process_group = True
        self.dp_rank, self.dp_size = dist.get_rank(), dist.get_world_size()
        self.device = torch.device("cuda", torch.cuda.current_device()) if torch.cuda.is_available() else torch.device("cpu")
        self.mesh = init_device_mesh(self.device.type, (self.dp_size,), mesh_dim_names=("dp",))
        torch.manual_seed(seed)
        # with sequence packing every pass is packed, through rlkit's registered per-row attention
        attention = packed_attention.register() if cfg.sequence_packing.enabled else "sdpa"
        model = AutoModelForCausalLM.from_pretrained(cfg.model_name, dtype=torch.float32, attn_implementation=attention)
        model.to(self.device)
        mixed = fsdp_mixed_precision(cfg.precision)
        for layer in model.model.layers:
            fully_shard(layer, mesh=self.mesh, mp_policy=mixed)
        # The root too reshards after each forward: otherwise its parameters stay unsharded plain tensors after
        # a no-grad pass, and the reference swap and checkpoints would meet them instead of DTensors.
        fully_shard(model, mesh=self.mesh, reshard_after_forward=True, mp_policy=mixed)
        for module in model.modules():
            if isinstance(module, FSDPModule):  # each FSDP unit keeps its own reduction settings
                module.set_gradient_divide_factor(1.0)  # sum over ranks: the loss is already a global value
                module.set_force_sum_reduction_for_comms(True)  # plain SUM (gloo has no AVG / PREMUL_SUM)
        self.model = model
        self._start_training()

    # ---- weights ----------------------------------------------------------------------------------
    def load_hf_state(self, hf: Mapping[str, Tensor]) -> None:
        """Load HF-named full tensors; this rank keeps its shard. Strict on names and shapes."""
        from torch.distributed.tensor import distribute_tensor

        params = dict(self.model.named_parameters())
        missing = sorted(set(params) - set(hf))
        if missing:
            raise KeyError(f"no HF weights for parameters {missing[:5]}")
        with torch.no_grad():
            for name, param in params.items():
                if tuple(hf[name].shape) != tuple(param.shape):
                    raise ValueError(f"{name}: HF weights have shape {tuple(hf[name].shape)}, model has {tuple(param.shape)}")
                full = hf[name].to(self.device, param.dtype)
                param.copy_(distribute_tensor(full, self.mesh, param.placements) if hasattr(param, "placements") else full)

    def export_hf_groups(self) -> Iterator[HFGroup]:
        """HF-named full tensors: embeddings, each decoder layer, then final norm and head. Gathering is a
        collective, so every rank must iterate in step. At one rank they may alias the live weights:
        copy them if you keep them past the next optimizer step."""
        groups: dict[str, list[tuple[str, Tensor]]] = {}
        for name, param in self.model.named_parameters():
            m = _LAYER.match(name)
            key = f"layer{int(m.group(1)):06d}" if m else ("0embed" if "embed_tokens" in name else "zfinal")
            groups.setdefault(key, []).append((name, param))
        for key in sorted(groups):
            yield [(name, self._full_tensor(param)) for name, param in groups[key]]

    @staticmethod
    def _full_tensor(param: Tensor) -> Tensor:
        t = param.detach()
        return t.full_tensor() if hasattr(t, "full_tensor") else t

    def parallel_layout(self) -> dict[str, int | str]:
        return {"backend": "dtensor", "data_parallel_size": self.dp_size}

    def _checkpoint_names(self) -> dict[str, str]:
        return {name: name for name, _ in self.model.named_parameters()}  # DTensors carry their own placement

    # ---- logprobs and training --------------------------------------------------------------------
    def _rows_group(self):
        return dist.group.WORLD

    def _logits(self, input_ids: Tensor) -> Tensor:
        """input_ids [b, T] -> logits [b, T, V], divided by the sampling temperature (right padding needs
        no mask: a causal model never looks at later positions)."""
        return self._scaled(self.model(input_ids=input_ids.to(self.device), use_cache=False).logits)

    def _packed_logits(self, packed: PackedRows) -> Tensor:
        """Packed rows -> logits [1, L, V] / temperature: position_ids restart per row (RoPE), and the registered
        attention (:mod:`rlkit.policy.packed_attention`) runs each row's segment of ``cu_seq_lens_q`` alone."""
        return self._scaled(self.model(input_ids=packed.input_ids.to(self.device),
                                       position_ids=packed.position_ids.to(self.device),
                                       cu_seq_lens_q=packed.cu_seqlens.to(self.device), use_cache=False).logits)

    def _token_logprobs_and_entropy(self, logits: Tensor, input_ids: Tensor,
                                    with_entropy: bool) -> tuple[Tensor, Tensor | None]:
        """One log-softmax over the full vocabulary (in fp32) for both."""
        logp = torch.log_softmax(logits[:, :-1].float(), dim=-1)
        token = torch.nn.functional.pad(logp.gather(-1, input_ids[:, 1:, None]).squeeze(-1), (1, 0))
        if not with_entropy:
            return token, None
        with torch.no_grad():
            return token, torch.nn.functional.pad(-(logp.exp() * logp).sum(-1), (1, 0))

    def _microbatch_starting(self, index: int, count: int) -> None:
        self.model.set_requires_gradient_sync(index == count - 1)  # reduce-scatter once, after the last backward

    def _grad_norm(self) -> float:
        sq = torch.zeros((), dtype=torch.float64, device=self.device)
        for p in self.model.parameters():
            if p.grad is not None:  # this rank's shard of a DTensor gradient
                sq += (p.grad.to_local() if hasattr(p.grad, "to_local") else p.grad).double().pow(2).sum()
        if self.dp_size > 1:
            dist.all_reduce(sq)  # FSDP shards are disjoint: the squares add up
        return float(sq.sqrt())

    def __repr__(self) -> str:
        a = self.arch
        return (f"DTensorPolicy({a.family}, {a.num_layers}x{a.hidden_size}, {self.cfg.precision}, FSDP2 over "
                f"{self.dp_size} rank(s), version={self.version})")
