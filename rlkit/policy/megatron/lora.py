"""LoRA adapters on Megatron-Core's column- and row-parallel linears, correct under tensor parallelism.

Each adapted linear gets an :class:`Adapter` submodule (parameters ``<linear>.adapter.lora_A`` [r, in] and
``lora_B`` [out, r]) and a forward hook that adds ``alpha/dim * B @ A @ dropout(x)`` to its output, so the base
weights keep their names and :mod:`.convert`'s mapping is unchanged. Every base weight is frozen: the optimizer,
Megatron's DDP buffers (it allocates them for ``requires_grad`` parameters only) and the gradient reduce see the
adapters alone.

Tensor parallelism: each adapter is sharded as its base is.

- Column-parallel (``linear_qkv``, ``linear_fc1``; weight [out/tp, in]): ``A`` [r, in] on every rank, ``B``
  [out/tp, r] split along dim 0 exactly as the base (fc1's ``[gate shard; up shard]``, the QKV's whole KV groups).
  ``A @ x`` passes Megatron's ``copy_to_tensor_model_parallel_region`` (identity forward, all-reduce backward),
  so ``A`` and the input receive the gradient of every rank's ``B`` shard.
- Row-parallel (``linear_proj``, ``linear_fc2``; weight [out, in/tp], input split): ``A`` [r, in/tp] split along
  dim 1 as the base, ``B`` [out, r] on every rank; ``A @ x`` is summed over ranks
  (``reduce_from_tensor_model_parallel_region``) before ``B``.
- Under sequence parallelism the column adapter gathers the sequence itself and the row adapter reduce-scatters
  it; the replicated factor then sees a part of the sequence per rank, so it is marked ``sequence_parallel`` and
  Megatron's ``finalize_model_grads`` sums its gradient over the tensor-parallel group, as it does for the norms.

Fused layouts: one adapter spans the fused QKV (and the fused gate/up): ``A`` is shared and ``B``'s rows follow
the fused layout, so the PEFT export splits ``B`` with :func:`.convert.split_qkv` (gate/up: halves) and gives
each HF projection the shared ``A``. That is exact: ``B_q @ A`` is the q rows of ``B @ A``.

Initial values: ``A`` from a generator seeded by the run seed and the layer's name (the same full ``A`` at any
TP size, then sharded), ``B = 0`` (the adapted model starts as the base), as peft does (Kaiming-uniform ``A``).

Deliberate simplifications: dense models, no pipeline parallelism (refused by the config check and here).
"""

from __future__ import annotations

import contextlib
import math
import zlib
from typing import Iterator

import torch
from torch import Tensor

from rlkit.config.components import LORA_FUSED_MODULES, LoraConfig
from rlkit.policy.megatron import convert

COLUMN = ("linear_qkv", "linear_fc1")  # the column-parallel linears; the others are row-parallel


class Adapter(torch.nn.Module):
    """``lora_A`` and ``lora_B`` of one (column- or row-parallel) linear; ``forward(x)`` is the update to add."""

    def __init__(self, column: bool, a: Tensor, b: Tensor, scaling: float, dropout: float, sequence_parallel: bool):
        from megatron.core.tensor_parallel import set_tensor_model_parallel_attributes

        super().__init__()
        self.column, self.scaling, self.sequence_parallel = column, scaling, sequence_parallel
        self.lora_A, self.lora_B = torch.nn.Parameter(a), torch.nn.Parameter(b)
        sharded, replicated = (self.lora_B, self.lora_A) if column else (self.lora_A, self.lora_B)
        set_tensor_model_parallel_attributes(sharded, True, 0 if column else 1, 1)
        replicated.sequence_parallel = sequence_parallel  # (finalize_model_grads sums it over TP under SP)
        self.dropout = torch.nn.Dropout(dropout) if dropout else torch.nn.Identity()
        self.enabled = True

    def forward(self, x: Tensor) -> Tensor:
        """x [s(/tp), b, in(/tp)] as the base linear receives it -> update [s(/tp), b, out(/tp)]."""
        from megatron.core import tensor_parallel as tp

        x = self.dropout(x).to(self.lora_A.dtype)
        if self.column:
            if self.sequence_parallel:
                h = torch.nn.functional.linear(tp.gather_from_sequence_parallel_region(x), self.lora_A)
            else:
                h = tp.copy_to_tensor_model_parallel_region(torch.nn.functional.linear(x, self.lora_A))
        else:
            h = torch.nn.functional.linear(x, self.lora_A)
            h = (tp.reduce_scatter_to_sequence_parallel_region(h) if self.sequence_parallel
                 else tp.reduce_from_tensor_model_parallel_region(h))
        return torch.nn.functional.linear(h, self.lora_B) * self.scaling


def _add_update(linear, args, output):
    """Forward hook of an adapted linear: ``(out, bias) -> (out + adapter(x), bias)``."""
    adapter = linear.adapter
    if not adapter.enabled:
        return output
    out, bias = output
    return out + adapter(args[0]).to(out.dtype), bias


def _initial_a(name: str, rank: int, fan_in: int, seed: int) -> Tensor:
    """The full ``A`` [r, fan_in] of linear ``name``: Kaiming-uniform (a=sqrt(5)), peft's and torch's default,
    drawn from a generator seeded by ``seed`` and the name, so every TP size starts from the same adapters."""
    g = torch.Generator().manual_seed(seed * 1_000_003 + zlib.crc32(name.encode()))
    bound = 1 / math.sqrt(fan_in)  # kaiming_uniform_(a=sqrt(5)) on [r, fan_in]
    return (torch.rand(rank, fan_in, generator=g) * 2 - 1) * bound


def add_adapters(model: torch.nn.Module, cfg: LoraConfig, seed: int) -> None:
    """Adapters on ``model``'s (a GPTModel, this TP rank's shards) chosen linears; every other parameter frozen."""
    from megatron.core import parallel_state as ps

    rank, size = ps.get_tensor_model_parallel_rank(), ps.get_tensor_model_parallel_world_size()
    sequence_parallel = model.config.sequence_parallel
    # Megatron's linears that get adapters: the fused ones whose HF parts are all chosen
    chosen = {n for n, parts in LORA_FUSED_MODULES.items() if set(parts) <= set(cfg.hf_targets())}
    for p in model.parameters():
        p.requires_grad_(False)
    for name, module in list(model.named_modules()):
        short = name.rsplit(".", 1)[-1]
        if short not in chosen:
            continue
        weight = module.weight
        column = short in COLUMN
        out_full = weight.shape[0] * (size if column else 1)
        in_full = weight.shape[1] * (1 if column else size)
        a_full = _initial_a(name, cfg.dim, in_full, seed)
        if column:
            a, b = a_full, torch.zeros(out_full // size, cfg.dim)
        else:
            a, b = torch.chunk(a_full, size, dim=1)[rank].clone(), torch.zeros(out_full, cfg.dim)
        module.adapter = Adapter(column, a.to(weight.device, weight.dtype), b.to(weight.device, weight.dtype), cfg.scaling,
                                 cfg.dropout, sequence_parallel)
        module.register_forward_hook(_add_update)
    if getattr(model, "output_layer", None) is not None:  # the head, frozen now (used while logits fit one chunk)
        model.output_layer.register_forward_hook(_contiguous_output_grad)
    if getattr(model, "embedding", None) is not None and model.config.recompute_granularity is not None:
        model.embedding.register_forward_hook(_decoder_input_requires_grad)


def _contiguous_output_grad(head, args, output):
    """Forward hook of the frozen head: its output's gradient is made contiguous before the head's backward.

    Why: Megatron's frozen-weight linear computes the input gradient as ``grad_output.matmul(weight)``, and the
    logits' gradient arrives as a transposed view ([s, b, vocab] of a [b, s, vocab] tensor), which torch.matmul
    cannot fold into one [s*b, vocab] @ [vocab, hidden] product: it broadcasts the weight to [s, vocab, hidden]
    instead (gigabytes at a large vocabulary). A contiguous gradient costs one copy of the logits' size and folds."""
    logits, bias = output
    if logits.requires_grad:
        logits.register_hook(torch.Tensor.contiguous)
    return output


def _decoder_input_requires_grad(embedding, args, output):
    """Forward hook of the frozen embedding: its output requires grad, so that the adapters after it get gradients
    under activation recompute (Megatron's checkpoint is a reentrant autograd Function, whose outputs require grad
    only if one of its inputs does; transformers' ``enable_input_require_grads`` does the same). It costs the
    gradient of the decoder's input, [s, b, h], which nothing reads."""
    return output if output.requires_grad else output.requires_grad_()


@contextlib.contextmanager
def adapters_disabled(*models: torch.nn.Module) -> Iterator[None]:
    """Every adapter of ``models`` off for the block (the base model computes), back on after."""
    adapters = [m for model in models if model is not None for m in model.modules() if isinstance(m, Adapter)]
    for a in adapters:
        a.enabled = False
    try:
        yield
    finally:
        for a in adapters:
            a.enabled = True


# ---- sharding and the HF / PEFT layouts of adapter tensors -----------------------------------------------
def is_adapter(name: str) -> bool:
    return ".adapter.lora_" in name


def shard_dim(name: str) -> int | None:
    """The dimension parameter ``name`` (base or adapter) is split along under tensor parallelism."""
    if not is_adapter(name):
        return convert.shard_dim(name)
    linear = name.split(".adapter.")[0].rsplit(".", 1)[-1]
    if linear in COLUMN:
        return 0 if name.endswith("lora_B") else None
    return 1 if name.endswith("lora_A") else None


def unshard(name: str, pieces: list[Tensor]) -> Tensor:
    """The full tensor from every rank's piece (fc1's ``B`` as its base weight: ``[gate; up]`` per rank)."""
    if not is_adapter(name):
        return convert.unshard(name, pieces)
    if shard_dim(name) is None or len(pieces) == 1:
        return pieces[0]
    if ".linear_fc1." in name:
        return convert.unshard("linear_fc1.weight", pieces)
    return torch.cat(pieces, dim=shard_dim(name))


HF_PARTS = {"linear_qkv": ("self_attn", ("q_proj", "k_proj", "v_proj")), "linear_proj": ("self_attn", ("o_proj",)),
            "linear_fc1": ("mlp", ("gate_proj", "up_proj")), "linear_fc2": ("mlp", ("down_proj",))}


def to_peft(layer: int, linear: str, a: Tensor, b: Tensor, arch) -> list[tuple[str, Tensor]]:
    """One fused adapter (full ``A`` [r, in], ``B`` [out, r]) -> PEFT-named tensors of its HF projections, each with
    the shared ``A`` and its rows of ``B``."""
    block, parts = HF_PARTS[linear]
    bs = convert.split_qkv(b, arch) if linear == "linear_qkv" else torch.chunk(b, len(parts), dim=0)
    prefix = f"base_model.model.model.layers.{layer}.{block}."
    return [(f"{prefix}{part}.lora_{x}.weight", t.clone()) for part, b_part in zip(parts, bs)
            for x, t in (("A", a), ("B", b_part))]
