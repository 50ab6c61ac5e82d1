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

Fused layouts (QKV, gate/up): by default one adapter per HF projection, as peft (and Megatron-Bridge's
``CanonicalLoRA``) puts them: ``lora_A.q_proj``/``lora_B.q_proj`` and so on, each projection's update written into
its rows of the fused output (the QKV's per-KV-group interleave, fc1's ``[gate; up]``), so a subset such as
``[q_proj, v_proj]`` can be adapted and the PEFT export is each projection's own pair. With
``policy.lora_cfg.fused_adapters`` one adapter spans the fused linear (Megatron-Bridge's ``LoRA``): ``A`` is shared
and ``B``'s rows follow the fused layout, so the PEFT export splits ``B`` with :func:`.convert.split_qkv`
(gate/up: halves) and gives each HF projection the shared ``A`` (exact: ``B_q @ A`` is the q rows of ``B @ A``).
Under tensor parallelism each projection's ``B`` is split along its rows (whole KV groups, as the base).

Initial values: ``A`` from a generator seeded by the run seed and the layer's (and projection's) name (the same
full ``A`` at any TP size, then sharded), ``B = 0`` (the adapted model starts as the base), as peft does
(Kaiming-uniform ``A``). A checkpoint that stores q/k/v and gate/up fused (Phi-3) gets one adapter per fused
linear, as peft puts one on each of its modules (``qkv_proj``, ``gate_up_proj``).

Deliberate simplifications: dense models, no pipeline parallelism (refused by the config check and here).
"""

from __future__ import annotations

import contextlib
import math
import zlib
from typing import Iterator

import torch
from torch import Tensor

from rlkit.config.backends import CHECKPOINT_FUSED_MODULES
from rlkit.config.components import LORA_FUSED_MODULES, LoraConfig
from rlkit.errors import ModelError
from rlkit.policy.megatron import convert

COLUMN = ("linear_qkv", "linear_fc1")  # the column-parallel linears; the others are row-parallel


class Adapter(torch.nn.Module):
    """The low-rank update of one (column- or row-parallel) linear; ``forward(x)`` is the update to add.

    One pair (``lora_A`` [r, in(/tp)], ``lora_B`` [out(/tp), r]) for a linear that is one HF projection or for a
    fused adapter; else ``parts`` (HF projection -> its pair, or the width of a projection left without one) in the
    fused layout's order, held as ``lora_A.<projection>`` / ``lora_B.<projection>``, whose updates are interleaved
    in ``groups`` blocks (this rank's KV groups for the QKV, 1 for fc1's ``[gate; up]``)."""

    def __init__(self, column: bool, parts: dict[str, tuple[Tensor, Tensor] | int], scaling: float, dropout: float,
                 sequence_parallel: bool, groups: int = 1):
        from megatron.core.tensor_parallel import set_tensor_model_parallel_attributes

        super().__init__()
        self.column, self.scaling, self.sequence_parallel, self.groups = column, scaling, sequence_parallel, groups
        pairs = {part: ab for part, ab in parts.items() if not isinstance(ab, int)}
        if list(parts) == [""]:
            self.lora_A, self.lora_B = (torch.nn.Parameter(t) for t in parts[""])
        else:
            self.lora_A = torch.nn.ParameterDict({p: torch.nn.Parameter(a) for p, (a, _) in pairs.items()})
            self.lora_B = torch.nn.ParameterDict({p: torch.nn.Parameter(b) for p, (_, b) in pairs.items()})
        self.widths = {part: ab for part, ab in parts.items() if isinstance(ab, int)}
        self.parts = list(parts)
        for a, b in self.factors():
            sharded, replicated = (b, a) if column else (a, b)
            set_tensor_model_parallel_attributes(sharded, True, 0 if column else 1, 1)
            replicated.sequence_parallel = sequence_parallel  # (finalize_model_grads sums it over TP under SP)
        self.dropout = torch.nn.Dropout(dropout) if dropout else torch.nn.Identity()
        self.enabled = True

    def factors(self) -> list[tuple[Tensor, Tensor]]:
        """(A, B) of each adapted projection, in layout order."""
        if isinstance(self.lora_A, torch.nn.Parameter):
            return [(self.lora_A, self.lora_B)]
        return [(self.lora_A[p], self.lora_B[p]) for p in self.parts if p in self.lora_A]

    def forward(self, x: Tensor) -> Tensor:
        """x [s(/tp), b, in(/tp)] as the base linear receives it -> update [s(/tp), b, out(/tp)]."""
        from megatron.core import tensor_parallel as tp

        dtype = self.factors()[0][0].dtype
        x = self.dropout(x).to(dtype)
        if self.column and self.sequence_parallel:
            x = tp.gather_from_sequence_parallel_region(x)
        updates, factors = [], iter(self.factors())
        for part in self.parts:
            if part in self.widths:  # a projection of the fused linear left without an adapter
                updates.append(x.new_zeros(*x.shape[:-1], self.widths[part]))
                continue
            a, b = next(factors)
            h = torch.nn.functional.linear(x, a)
            if self.column and not self.sequence_parallel:
                h = tp.copy_to_tensor_model_parallel_region(h)
            elif not self.column:
                h = (tp.reduce_scatter_to_sequence_parallel_region(h) if self.sequence_parallel
                     else tp.reduce_from_tensor_model_parallel_region(h))
            updates.append(torch.nn.functional.linear(h, b) * self.scaling)
        return updates[0] if len(updates) == 1 else convert.interleave(updates, self.groups, dim=-1)


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
    targets = set(cfg.hf_targets())
    for p in model.parameters():
        p.requires_grad_(False)
    for name, module in list(model.named_modules()):
        short = name.rsplit(".", 1)[-1]
        if short not in LORA_FUSED_MODULES or not targets & set(LORA_FUSED_MODULES[short]):
            continue
        weight = module.weight
        parts, groups = _parts(name, short, weight, model.config, cfg, targets, seed, rank, size)
        module.adapter = Adapter(short in COLUMN, parts, cfg.scaling, cfg.dropout, model.config.sequence_parallel,
                                 groups)
        if not getattr(type(module), "adds_adapter_update", False):  # (a post-norm linear adds it before its norm)
            module.register_forward_hook(_add_update)
    if getattr(model, "output_layer", None) is not None:  # the head, frozen now (used while logits fit one chunk)
        model.output_layer.register_forward_hook(_contiguous_output_grad)
    if getattr(model, "embedding", None) is not None and model.config.recompute_granularity is not None:
        model.embedding.register_forward_hook(_decoder_input_requires_grad)


def _parts(name: str, short: str, weight: Tensor, config, cfg: LoraConfig, targets: set[str], seed: int, rank: int,
           size: int) -> tuple[dict[str, tuple[Tensor, Tensor] | int], int]:
    """This rank's initial factors of linear ``name`` for :class:`Adapter` (``{"": (A, B)}`` for one adapter, else
    per HF projection: (A, B), or its width where it has none) and its interleave's group count."""
    column = short in COLUMN
    out_local, in_full = weight.shape[0], weight.shape[1] * (1 if column else size)

    def pair(key: str, rows: int) -> tuple[Tensor, Tensor]:
        a = _initial_a(key, cfg.dim, in_full, seed)
        if not column:
            a = torch.chunk(a, size, dim=1)[rank].clone()
        b = torch.zeros(rows if column else out_local, cfg.dim)
        return a.to(weight.device, weight.dtype), b.to(weight.device, weight.dtype)

    projections = LORA_FUSED_MODULES[short]
    if len(projections) == 1 or cfg.fused_adapters:
        return {"": pair(name, out_local)}, 1
    if short == "linear_qkv":
        groups, d = (config.num_query_groups or config.num_attention_heads) // size, config.kv_channels
        widths = (config.num_attention_heads // size * d, groups * d, groups * d)
    else:  # fc1: [gate; up] on this rank
        groups, widths = 1, (out_local // 2, out_local // 2)
    return {p: pair(f"{name}.{p}", w) if p in targets else w for p, w in zip(projections, widths)}, groups


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
        return 0 if ".lora_B" in name else None
    return 1 if ".lora_A" in name else None


def unshard(name: str, pieces: list[Tensor]) -> Tensor:
    """The full tensor from every rank's piece (a fused adapter's fc1 ``B`` as its base weight: ``[gate; up]`` per
    rank; a projection's own ``B``: its rows in rank order)."""
    if not is_adapter(name):
        return convert.unshard(name, pieces)
    if shard_dim(name) is None or len(pieces) == 1:
        return pieces[0]
    if name.endswith(".linear_fc1.adapter.lora_B"):
        return convert.unshard("linear_fc1.weight", pieces)
    return torch.cat(pieces, dim=shard_dim(name))


def factor_names(linear: str, names) -> dict[str, tuple[str, str]]:
    """The adapter parameters of linear ``linear`` (e.g. ``decoder.layers.0.self_attention.linear_qkv``) among
    ``names``: HF projection (``""`` for one adapter over the whole linear) -> (A's name, B's name), in the fused
    layout's order; empty when the linear has none."""
    a = f"{linear}.adapter.lora_A"
    if a in names:
        return {"": (a, f"{linear}.adapter.lora_B")}
    order = LORA_FUSED_MODULES.get(linear.rsplit(".", 1)[-1], ())
    return {p: (f"{a}.{p}", f"{linear}.adapter.lora_B.{p}") for p in order if f"{a}.{p}" in names}


def adapted_linears(names) -> list[str]:
    """The linears (``...linear_qkv``) that hold adapters, from parameter ``names``, sorted."""
    return sorted({n.split(".adapter.")[0] for n in names if is_adapter(n)})


HF_PARTS = {"linear_qkv": ("self_attn", ("q_proj", "k_proj", "v_proj")), "linear_proj": ("self_attn", ("o_proj",)),
            "linear_fc1": ("mlp", ("gate_proj", "up_proj")), "linear_fc2": ("mlp", ("down_proj",))}


def check_fused_targets(cfg: LoraConfig, family: str) -> None:
    """A model whose checkpoint fuses q/k/v and gate/up (Phi-3) takes adapters on whole fused modules, as peft
    puts them; a subset of one is refused with the fix."""
    targets = set(cfg.hf_targets())
    for linear, module in CHECKPOINT_FUSED_MODULES.items():
        parts = set(LORA_FUSED_MODULES[linear])
        if targets & parts and not parts <= targets:
            raise ModelError(f"policy.lora_cfg.target_modules: {family}'s checkpoint holds {', '.join(sorted(parts))} "
                             f"as one module, {module}, so its adapter covers all of them; name all (or {linear}), "
                             "or none")


def to_peft(layer: int, linear: str, factors: dict[str, tuple[Tensor, Tensor]], arch) -> list[tuple[str, Tensor]]:
    """One linear's full factors (:func:`factor_names`' keys -> ``A`` [r, in], ``B`` [out, r]) -> PEFT-named
    tensors of its HF projections: each projection's own pair, or, for one fused adapter, the shared ``A`` and
    each projection's rows of ``B``; where the checkpoint fuses them too (Phi-3), that module's pair, ``B`` in
    its row order (``[q; k; v]``, ``[gate; up]``)."""
    block, parts = HF_PARTS[linear]
    prefix = f"base_model.model.model.layers.{layer}.{block}."
    if "" in factors and arch.fused_projections and linear in CHECKPOINT_FUSED_MODULES:
        a, b = factors[""]
        b = torch.cat(convert.split_qkv(b, arch)) if linear == "linear_qkv" else b
        module = CHECKPOINT_FUSED_MODULES[linear]
        return [(f"{prefix}{module}.lora_{x}.weight", t.clone()) for x, t in (("A", a), ("B", b))]
    if "" in factors:
        a, b = factors[""]
        bs = convert.split_qkv(b, arch) if linear == "linear_qkv" else torch.chunk(b, len(parts), dim=0)
        factors = {part: (a, b_part) for part, b_part in zip(parts, bs)}
    return [(f"{prefix}{part}.lora_{x}.weight", t.clone()) for part, (a, b) in factors.items()
            for x, t in (("A", a), ("B", b))]


def full_update(linear: str, factors: dict[str, tuple[Tensor, Tensor]], arch, out: int) -> Tensor:
    """``B @ A`` [out, in] of one linear from its full factors (:func:`to_peft`'s), fp32: each projection's update in
    its rows of the fused layout, zero for a projection without an adapter."""
    if "" in factors:
        a, b = factors[""]
        return b.float() @ a.float()
    parts = LORA_FUSED_MODULES[linear]
    if linear == "linear_qkv":
        groups, d = arch.num_key_value_heads, arch.head_dim
        widths = (arch.num_attention_heads * d, groups * d, groups * d)
    else:
        groups, widths = 1, (out // len(parts),) * len(parts)
    fan_in = next(iter(factors.values()))[0].shape[1]
    updates = [factors[p][1].float() @ factors[p][0].float() if p in factors else torch.zeros(w, fan_in)
               for p, w in zip(parts, widths)]
    return updates[0] if len(updates) == 1 else convert.interleave(updates, groups, dim=0)


def merged_weight(name: str, full: Tensor, params, gather, arch, scaling: float) -> Tensor:
    """Weight ``name``'s full tensor ``full`` [out, in] with its adapters' update added (``W + scaling * B @ A``,
    each projection's in its rows; fp32 math, ``full``'s dtype), or ``full`` when it has none; ``gather(name)``: a
    parameter of ``params`` as a full tensor."""
    stem = name.removesuffix(".weight")
    names = factor_names(stem, params) if name.endswith(".weight") else {}
    if not names:
        return full
    factors = {part: (gather(a), gather(b)) for part, (a, b) in names.items()}
    update = full_update(stem.rsplit(".", 1)[-1], factors, arch, full.shape[0])
    return (full.float() + scaling * update).to(full.dtype)
