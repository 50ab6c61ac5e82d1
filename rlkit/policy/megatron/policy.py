"""The Megatron-Core policy: a GPTModel built from an HF folder, scored and trained in this process.

Why in-process: a notebook kernel holds the model, so a researcher can change the loss and re-run one
step in seconds. The same class is what a Ray worker runs per rank, so no code here assumes TP=1 or DP=1:
weights are sharded per tensor-parallel rank (and experts per expert-parallel rank), gradients are summed
over the ranks that hold the same weights and see different data, and the loss is normalised by counts
over the global batch.

What is shared with the other backends (the logprob and microbatch loops, the optimizer step, the reference,
checkpoint state) is the training loop :class:`rlkit.policy.in_process.InProcessPolicy`; :class:`MegatronAdapter`
(a :class:`rlkit.policy.adapter.ModelAdapter`) supplies the model, its fused head and vocabulary-parallel
logprobs, its gradient reductions, its pipeline runner and its HF mapping.

Gradients: Megatron-Core's own ``DistributedDataParallel`` (contiguous gradient buffers, bucketed reduce,
optional ``overlap_grad_reduce``: ``policy.megatron_cfg.distributed_data_parallel_config``) and its
``finalize_model_grads`` (sequence-parallel norms, Qwen3's q/k norms and a tied embedding), on GPUs and on the
CPU (gloo) alike; after the reduce each parameter's ``.grad`` is its ``main_grad``.

Precision (``policy.precision``): float32, or bfloat16 with fp32 master weights: ``self.model`` is then the
fp32 master (what the optimizer, checkpoints and refit see) and a bf16 copy run through Megatron's
``Float16Module`` inside DDP does forward and backward, its gradients accumulated in DDP's fp32 buffers
(:mod:`rlkit.policy.precision`). With ``policy.optimizer.main_params_dtype=bfloat16`` (pure bf16) ``self.model`` is
itself bf16 and runs through ``Float16Module`` (fp32 logits), with bf16 gradient buffers and AdamW state.

Deliberate simplifications: plain ``torch.optim.AdamW`` over the fp32 weights (Megatron's mixed-precision and
distributed optimizers allocate with ``device="cuda"`` and check ``torch.cuda`` tensor types: they cannot run
on a CPU, and the distributed one is refused by the config check). Without pipeline parallelism microbatches
run one after another in a plain loop (what a researcher steps through); with it Megatron's schedule runs
them (:mod:`.pipeline`).
"""

from __future__ import annotations

import contextlib
import dataclasses
import re
from typing import Any, Callable, Iterator, Mapping, Optional

import torch
import torch.distributed as dist
from megatron.core import parallel_state as ps
from megatron.core.distributed import finalize_model_grads
from megatron.core.packed_seq_params import PackedSeqParams
from megatron.core.tensor_parallel import param_is_not_tensor_parallel_duplicate
from megatron.core.transformer.module import Float16Module, param_is_not_shared
from megatron.core.utils import unwrap_model
from megatron.core.transformer.transformer_layer import get_transformer_layer_offset
from torch import Tensor

from rlkit.config.components import PolicyConfig
from rlkit.errors import ModelError
from rlkit.host_memory import release_freed_heap_pages
from rlkit.policy.adapter import ModelAdapter
from rlkit.policy.in_process import InProcessPolicy
from rlkit.policy.optimizer import sum_of_squares
from rlkit.policy.megatron import convert, head, lora, parallel, pipeline
from rlkit.policy.architecture import Architecture, load_hf_state
from rlkit.policy.frozen_base import FrozenBase
from rlkit.policy.megatron.build import bf16_twin_of, build_gpt_model, data_parallel_wrapper, transformer_config
from rlkit.policy.megatron.cpu import return_freed_pages_after_each_layer
from rlkit.policy.megatron.scores import shifted_entropy, shifted_token_logprobs
from rlkit.policy.megatron.shared_prompt import rope_at, share_prompts
from rlkit.policy.packing import PackedRows, pack_rows
from rlkit.weights import HFGroup


_LAYER_NAME = re.compile(r"^decoder\.layers\.(\d+)\.")


def _base_group(name: str):
    """The group of base weight ``name`` a released base is read back in: its decoder layer, else "ends"."""
    m = _LAYER_NAME.match(name)
    return int(m.group(1)) if m else "ends"


def MegatronPolicy(cfg: PolicyConfig, seed: int = 0) -> InProcessPolicy:  # the loop over a MegatronAdapter
    return InProcessPolicy(MegatronAdapter(cfg, seed))


class MegatronAdapter(ModelAdapter):
    """A causal LM on Megatron-Core with HF weights in and out."""

    architecture = Architecture  # what it reads from the HF folder (the MoE subclass reads more)

    def __init__(self, cfg: PolicyConfig, seed: int = 0):
        self.cfg, self._seed = cfg, seed
        self.arch = self.architecture.from_hf_folder(cfg.model_name)
        if cfg.lora_cfg.enabled and getattr(self.arch, "num_experts", 0):
            raise ModelError("policy.lora_cfg: adapters on Megatron's Mixture-of-Experts models are not built yet "
                             "(the experts' linears); train this model with policy.lora_cfg.enabled=false")
        if cfg.lora_cfg.enabled and self.arch.fused_projections:
            lora.check_fused_targets(cfg.lora_cfg, self.arch.family)
        mc = cfg.megatron_cfg
        self.layout = parallel.ParallelLayout(**mc.model_dump(include=set(parallel.ParallelLayout.__dataclass_fields__)))
        self._parallel_generation = parallel.init_parallel(self.layout, seed)
        self.holds_process_group = True
        self.tp_rank, self.tp_size = ps.get_tensor_model_parallel_rank(), ps.get_tensor_model_parallel_world_size()
        self.pp_rank, self.pp_size = ps.get_pipeline_model_parallel_rank(), ps.get_pipeline_model_parallel_world_size()
        self.dp_rank, self.dp_size = ps.get_data_parallel_rank(), ps.get_data_parallel_world_size()
        self.leader = self.tp_rank == 0 and self.pp_rank == 0
        self.device = parallel.device()  # the model's; batches and results stay where the caller keeps them
        self.model = self._build_model()
        self._layer_offset = get_transformer_layer_offset(self.model.config)  # this stage's first layer
        # with adapters at bf16 the base is held once, in bf16: read in after the copy made it the master's, so the
        # fp32 base is never filled (its pages never touched: 4 bytes per parameter less at the load's peak)
        base_once = cfg.precision == "bfloat16" and not cfg.pure_bf16 and self._lora_cfg() is not None
        if not base_once:
            self.copy_hf_state(load_hf_state(cfg.model_name))
        self._forward_module = self.model
        self._grad_pairs = [(p, p) for p in self.model.parameters() if p.requires_grad]  # (optimizer's, DDP's)
        ddp_cfg = mc.distributed_data_parallel_config
        if cfg.pure_bf16:  # the bf16 model is what trains: no masters, bf16 gradient buffers
            self._forward_module = Float16Module(self.model.config, self.model)
            ddp_cfg = ddp_cfg.model_copy(update={"grad_reduce_in_fp32": False})
        elif cfg.precision == "bfloat16":
            self.twin, self._forward_module = bf16_twin_of(self.model, self.arch, self.model.config,
                                                            getattr(self.arch, "num_experts", 0),
                                                            self._lora_cfg(), seed)
            self._grad_pairs = [(fp32, bf16) for fp32, bf16 in self.twin.pairs if fp32.requires_grad]
        if base_once:
            self.copy_hf_state(load_hf_state(cfg.model_name))
            self.twin.pull()
        self._forward_module = data_parallel_wrapper(self._forward_module, ddp_cfg)
        if self.device.type == "cpu" and cfg.return_freed_host_memory:  # (the module that computes: at bf16 the copy)
            return_freed_pages_after_each_layer(unwrap_model(self._forward_module))
        if self.pp_size > 1:  # Megatron's schedule runs the microbatches
            self.pipeline = pipeline.PipelineSchedule(self._forward_module, self._stage_forward, self._padded_length)
        self._no_sync = None  # Megatron's no_sync() context, held over all but the last microbatch

    def _build_model(self):
        config = transformer_config(self.arch, self.tp_size, self.layout.sequence_parallel, self.pp_size,
                                    torch.bfloat16 if self.cfg.pure_bf16 else torch.float32,
                                    recompute=self.cfg.megatron_cfg.recompute_settings(),
                                    initialize=False)  # every weight is read from the folder next (strict)
        model = build_gpt_model(self.arch, config)
        if self._lora_cfg() is not None:
            lora.add_adapters(model, self._lora_cfg(), self._seed)
        return model

    # ---- adapters (policy.lora_cfg, rlkit.policy.megatron.lora) --------------------------------------
    def _lora_cfg(self):
        """The enabled adapters' settings (None without); a checkpoint with fused projections (Phi-3: qkv_proj,
        gate_up_proj) gets one adapter per fused linear, as peft puts one on each of its modules."""
        if not self.cfg.lora_cfg.enabled:
            return None
        if self.arch.fused_projections:
            return self.cfg.lora_cfg.model_copy(update={"fused_adapters": True})
        return self.cfg.lora_cfg

    def adapters_disabled(self):
        return lora.adapters_disabled(self.model, self.twin.compute if self.twin is not None else None)

    def export_adapter_tensors(self) -> Iterator[tuple[str, Tensor]]:
        """The adapters as full tensors under their PEFT file names, one pair per HF projection (a fused adapter's
        ``B`` split, its ``A`` shared: :func:`rlkit.policy.megatron.lora.to_peft`); every TP rank calls (gathers)."""
        params = dict(self.model.named_parameters())
        for stem in lora.adapted_linears(params):
            layer, linear = int(_LAYER_NAME.match(stem).group(1)), stem.rsplit(".", 1)[-1]
            factors = {part: (self._full_tensor(a, params), self._full_tensor(b, params))
                       for part, (a, b) in lora.factor_names(stem, params).items()}
            yield from lora.to_peft(layer, linear, factors, self.arch)

    # ---- weights ----------------------------------------------------------------------------------
    def _global_name(self, local_name: str) -> str:
        """This rank's parameter name -> the whole model's (decoder layers numbered across pipeline stages)."""
        return pipeline.with_layer_offset(local_name, self._layer_offset)

    def _params_by_global_name(self) -> dict[str, Tensor]:
        """The base weights (adapters have no HF name) by global name."""
        return {self._global_name(n): p for n, p in self.model.named_parameters() if not lora.is_adapter(n)}

    def _hf_to_megatron_groups(self, hf: Mapping[str, Tensor], layers: list[int],
                               ends: bool = True) -> Iterator[dict[str, Tensor]]:
        return convert.hf_to_megatron_groups(hf, self.arch, layers=layers, ends=ends)

    def _megatron_to_hf_groups(self, full: Callable[[str], Tensor]) -> Iterator[HFGroup]:
        return convert.megatron_to_hf_groups(full, self.arch)

    def _shard_rank_and_size(self, name: str) -> tuple[int, int]:
        """The tensor-parallel rank and size that split parameter ``name``."""
        return self.tp_rank, self.tp_size

    def copy_hf_state(self, hf: Mapping[str, Tensor]) -> None:
        """Copy HF-named full tensors; this rank keeps its pipeline stage's parameters and its tensor-parallel
        shard of each. One group (a layer) is converted at a time, so with a lazy ``hf`` (:func:`load_hf_state`)
        the whole model is never held twice. Strict on names and shapes: a first pass on meta tensors checks
        every name and shape before anything is copied."""
        from rlkit.models.safetensors_folder import as_meta

        params = self._params_by_global_name()
        layers = sorted({int(m.group(1)) for n in params if (m := _LAYER_NAME.match(n))})
        self._copy_from(self._hf_to_megatron_groups(as_meta(hf), layers), params, check_only=True)
        with torch.no_grad():
            self._copy_from(self._hf_to_megatron_groups(hf, layers), params, check_only=False)

    def _copy_from(self, groups: Iterator[dict[str, Tensor]], params: Mapping[str, Tensor], check_only: bool) -> None:
        """Copy each group's tensors (sharded for this rank) into ``params``; every parameter must be covered."""
        covered = set()
        for full in groups:
            if self.arch.tie_word_embeddings and self.pp_size > 1 and "embedding.word_embeddings.weight" in full:
                full["output_layer.weight"] = full["embedding.word_embeddings.weight"]  # the last stage's copy
            for name in full.keys() & params.keys():
                piece = convert.shard(name, full[name], *self._shard_rank_and_size(name))
                if piece.shape != params[name].shape:
                    raise ValueError(f"{name}: HF weights give shape {tuple(piece.shape)}, model has "
                                     f"{tuple(params[name].shape)}")
                if not check_only:
                    params[name].copy_(piece)
                covered.add(name)
            del full  # this layer's tensors go before the generator converts the next (one layer in memory)
        missing = sorted(set(params) - covered)
        if missing:
            raise KeyError(f"no HF weights for Megatron parameters {missing[:5]}")

    def _full_tensor(self, name: str, params: Mapping[str, Tensor], group=None) -> Tensor:
        """Parameter ``name`` gathered over its tensor-parallel ``group`` (default: Megatron's TP group)."""
        local = params[name].detach()
        group = ps.get_tensor_model_parallel_group() if group is None else group
        size = dist.get_world_size(group)
        if size == 1 or lora.shard_dim(name) is None:
            return local
        pieces = [torch.empty_like(local) for _ in range(size)]
        dist.all_gather(pieces, local.contiguous(), group=group)
        return lora.unshard(name, pieces)

    def _stage_full_tensor(self, name: str, params: Mapping[str, Tensor]) -> Tensor:
        """Full tensor of parameter ``name`` of this pipeline stage (gathered over tensor parallelism); an
        adapted linear's weight merged with its adapters (:func:`rlkit.policy.megatron.lora.merged_weight`)."""
        full = self._full_tensor(name, params)
        if self._lora_cfg() is None:
            return full
        every = dict(self.model.named_parameters())
        return lora.merged_weight(name, full, every, lambda n: self._full_tensor(n, every), self.arch,
                                  self.cfg.lora_cfg.scaling)

    # ---- the frozen base of adapters, released while an engine generates (policy.lora_cfg) ------------
    def release_frozen_base(self) -> int:
        if self.frozen_base is None:
            if self._lora_cfg() is None:
                raise ValueError("release_frozen_base: only adapters leave frozen weights, and this policy trains "
                                 "every weight (set policy.lora_cfg.enabled=true to train adapters on a frozen base)")
            groups: dict = {}
            for name, param in self._params_by_global_name().items():
                groups.setdefault(_base_group(name), []).append(param)
            self.frozen_base = FrozenBase(groups, self._reload_base)
        return self.frozen_base.release()

    def _reload_base(self, group) -> None:
        """Copy the model folder's weights of base group ``group`` (a decoder layer, "ends": embedding, final norm
        and head; None: all) into the model, through the conversion of the first load."""
        hf = load_hf_state(self.cfg.model_name)
        if group is None:
            return self.copy_hf_state(hf)
        params = {n: p for n, p in self._params_by_global_name().items() if _base_group(n) == group}
        layers, ends = ([], True) if group == "ends" else ([group], False)
        with torch.no_grad():
            self._copy_from(self._hf_to_megatron_groups(hf, layers, ends), params, check_only=False)

    def export_hf_groups(self) -> Iterator[HFGroup]:
        """HF-named full tensors, one fused group at a time, the same on every rank (each pipeline stage
        broadcasts its layers). At TP=1 and PP=1 they are views of the live weights: copy them if you keep
        them past the next optimizer step. A released frozen base (:meth:`release_frozen_base`) is read back
        one layer at a time and released again as the export moves on (the embedding and final norm stay
        until its end), so a refit holds one layer of it beside the engine's weights."""
        base = self.frozen_base if self.frozen_base is not None and self.frozen_base.released else None
        params = self._params_by_global_name()

        def full(name: str) -> Tensor:
            if base is not None:
                base.restore(_base_group(name))
            if self.pp_size == 1:
                return self._stage_full_tensor(name, params)
            owner = pipeline.owner_stage(name, self.arch.num_layers, self.pp_size)
            mine = self._stage_full_tensor(name, params) if owner == self.pp_rank else None
            return pipeline.broadcast_from_stage(mine, owner)

        for group in self._megatron_to_hf_groups(full):
            yield group
            if base is not None:  # (the consumer is done with it)
                for layer in base.keys():
                    if layer != "ends":
                        base.release(layer)
        if base is not None:
            base.release()

    def parallel_layout(self) -> dict[str, int | str | bool | None]:
        return dict(dataclasses.asdict(self.layout), backend="megatron",
                    data_parallel_size=ps.get_data_parallel_world_size())

    def checkpoint_names(self) -> dict[str, str]:
        """Global names (layers numbered across stages, experts globally), with the shard's rank for a tensor
        split by tensor (or expert-tensor) parallelism."""
        names = {}
        for local, _ in self.model.named_parameters():
            name = self._global_name(local)
            rank, size = self._shard_rank_and_size(name)
            names[local] = name if size == 1 or lora.shard_dim(name) is None else f"{name}@tp{rank}of{size}"
        return names

    # ---- logprobs ----------------------------------------------------------------------------------
    def _padded_length(self, t: int) -> int:
        """Under sequence parallelism the sequence is split over the tensor-parallel ranks, so a forward pass
        runs on a multiple of their number of positions; causal attention keeps the right padding out of the
        first ``t`` positions."""
        return t + (-t % self.tp_size if self.layout.sequence_parallel else 0)

    def _stage_forward(self, input_ids: Tensor, positions: Optional[Tensor] = None,
                       attention_mask: Optional[Tensor] = None, **packed) -> Tensor:
        """input_ids [b, t] (t already padded) -> this stage's output: logits [b, t, V/tp] (fp32) on the last
        stage, hidden states for the next stage otherwise. Causal attention by the layer spec's mask type unless
        ``attention_mask`` [b, 1, t, t] (bool, True: masked) is given. ``positions`` [b, t] default to 0..t-1 per
        row; ``packed``: ``packed_seq_params`` of packed rows. The bf16 copy follows the fp32 model's train/eval
        mode."""
        b, t = input_ids.shape
        if positions is None:
            positions = torch.arange(t, device=self.device).unsqueeze(0).expand(b, t)
        mask = None if attention_mask is None else attention_mask.to(self.device)
        self._forward_module.train(self.model.training)
        return self._forward_module(input_ids.to(self.device), positions.to(self.device), mask, **packed)

    def logits(self, input_ids: Tensor) -> Tensor:
        """input_ids [b, T] -> logits [b, T, V/tp] (one stage only)."""
        t = input_ids.shape[1]
        ids = torch.nn.functional.pad(input_ids, (0, self._padded_length(t) - t))
        return self._stage_forward(ids)[:, :t]

    # ---- generation on these weights (rlkit.policy.megatron.generator) -------------------------------
    def own_generator(self, cfg: Any, max_model_len: int, seed: int) -> Any:
        """A generator that samples from this model itself (``policy.generation.backend: megatron``)."""
        from rlkit.policy.megatron.generator import MegatronGenerator

        return MegatronGenerator(self, cfg, max_model_len, seed)

    def inference_context(self, batch_size: int, max_length: int) -> Any:
        """Megatron-Core's static inference context: the KV cache of ``batch_size`` rows of up to ``max_length``
        positions, filled by :meth:`inference_logits`."""
        from megatron.core.inference.contexts import StaticInferenceContext

        return StaticInferenceContext(batch_size, max_length)

    def inference_logits(self, input_ids: Tensor, start: int, context: Any) -> Tensor:
        """input_ids [b, t] at positions ``start .. start+t-1``, their keys and values appended to ``context``'s
        cache -> the fp32 logits [b, V] of the last position (the whole vocabulary). Eval mode for the call, the
        compute copy the passes use (bf16 under ``policy.precision=bfloat16``)."""
        b, t = input_ids.shape
        positions = torch.arange(start, start + t, device=self.device).unsqueeze(0).expand(b, t)
        if start > 0:
            context.enable_decode_mode()
        training = self.model.training
        self._forward_module.eval()
        try:
            out = self._forward_module(input_ids.to(self.device), positions, None, inference_context=context,
                                       runtime_gather_output=True)
        finally:
            self._forward_module.train(training)
        context.sequence_len_offset += t
        return out[:, -1].float()

    def pack(self, input_ids: Tensor, attention_mask: Tensor) -> PackedRows:
        """Under sequence parallelism the packed sequence is split over the tensor-parallel ranks: its length is
        padded to a multiple of their number by a filler segment."""
        multiple = self.tp_size if self.layout.sequence_parallel else 1
        return pack_rows(input_ids, attention_mask.sum(1).tolist(), multiple_of=multiple)

    def packed_logits(self, packed: PackedRows) -> Tensor:
        """Packed rows -> logits [1, L, V/tp]: Megatron's "thd" format (``PackedSeqParams``), whose
        ``cu_seqlens`` restart RoPE per row and which the core attention runs row by row
        (:mod:`rlkit.policy.megatron.attention`)."""
        return self._stage_forward(packed.input_ids, packed.position_ids, **self._packed_params(packed))

    def _packed_params(self, packed: PackedRows) -> dict[str, PackedSeqParams]:
        cu = packed.cu_seqlens.to(self.device)
        return {"packed_seq_params": PackedSeqParams(qkv_format="thd", cu_seqlens_q=cu, cu_seqlens_kv=cu,
                                                     max_seqlen_q=packed.max_seqlen, max_seqlen_kv=packed.max_seqlen)}

    def fused_scores(self, input_ids: Tensor, with_entropy: bool, temperature: float, packed: Optional[PackedRows],
                     scored: Optional[Tensor]) -> Optional[tuple[Tensor, Optional[Tensor]]]:
        """The decoder's output scored by the fused head (:mod:`.head`) when the [b, t, V/tp] fp32 logits would exceed
        one of its chunks: they are then never held, and only the positions ``scored`` marks (the ids' layout)
        get logits. None for smaller ones: the loop scores the full logits (the two agree within 1e-6, but a long
        run's trajectory follows the rounding)."""
        t = input_ids.shape[1]
        chunk_bytes = self.cfg.megatron_cfg.fused_head_chunk_bytes
        if input_ids.numel() * (self.arch.vocab_size // self.tp_size) * 4 <= chunk_bytes:
            return None
        pad = (0, self._padded_length(t) - t)
        ids, positions, kwargs = torch.nn.functional.pad(input_ids, pad), None, {}
        if scored is not None and packed is None:
            scored = torch.nn.functional.pad(scored, pad)
        if packed is not None:
            ids, positions, kwargs = packed.input_ids, packed.position_ids, self._packed_params(packed)
        gpt = unwrap_model(self._forward_module)
        with head.hidden_states_out(gpt):
            hidden = self._stage_forward(ids, positions, **kwargs)
        if self.device.type == "cpu":  # the decoder's freed working tensors, not kept under the head's (on a GPU
            release_freed_heap_pages()  # they were never in glibc's heap: no host-side trim per microbatch)
        values = head.head_scores(hidden, head.output_weight(gpt), ids.to(self.device), temperature,
                                  self.layout.sequence_parallel, with_entropy, chunk_bytes,
                                  None if scored is None else scored.to(self.device))
        return tuple(v if v is None else v[:, :t] for v in values)

    def shared_prompt_scores(self, input_ids: Tensor, attention_mask: Tensor, with_entropy: bool, scored: Tensor,
                             temperature: float) -> Optional[list[Tensor]]:
        """With ``policy.megatron_cfg.share_prompts``: the rows that share a prompt as one sequence per group
        (:mod:`.shared_prompt`), scored by the fused head at the positions ``scored`` [b, T] marks -> [logprobs] or
        [logprobs, entropy], each [b, T], 0 elsewhere. None (the ordinary rows) where no two rows share a prompt,
        or under a layout the shared sequence does not take (sequence parallel, pipeline, context parallel, packing), or
        with a sliding window (Gemma 3's local layers: Megatron's window mask replaces the shared sequence's)."""
        layout = self.layout
        if (not self.cfg.megatron_cfg.share_prompts or layout.sequence_parallel or self.pipeline is not None
                or layout.context_parallel_size > 1 or self.cfg.sequence_packing.enabled or self.arch.sliding_window):
            return None
        shared = share_prompts(input_ids, attention_mask, scored)
        if shared is None:
            return None
        gpt = unwrap_model(self._forward_module)
        with head.hidden_states_out(gpt), rope_at(gpt, shared.positions):
            hidden = self._stage_forward(shared.input_ids, shared.positions, shared.mask)  # [S, g, h]
        source = shared.source.to(self.device)
        values = head.pair_scores(hidden[source[:, 1], source[:, 0]], head.output_weight(gpt), shared.targets,
                                  temperature, with_entropy, self.cfg.megatron_cfg.fused_head_chunk_bytes)
        where = tuple(shared.where.to(input_ids.device).t())
        return [torch.zeros(input_ids.shape, dtype=v.dtype, device=input_ids.device).index_put(where, v.to(input_ids.device))
                for v in values if v is not None]

    def rows_group(self):
        return ps.get_data_parallel_group()

    def token_logprobs_and_entropy(self, logits: Tensor, input_ids: Tensor,
                                   with_entropy: bool) -> tuple[Tensor, Optional[Tensor]]:
        entropy = shifted_entropy(logits, ps.get_tensor_model_parallel_group()) if with_entropy else None
        return shifted_token_logprobs(logits, input_ids), entropy

    # ---- training ---------------------------------------------------------------------------------
    def grad_norm(self) -> float:
        sq = torch.zeros((), dtype=torch.float64, device=self.device)  # parameters every rank holds (TP shards summed)
        expert_sq = torch.zeros((), dtype=torch.float64, device=self.device)  # experts split by expert parallelism
        for p in self.model.parameters():
            if p.grad is None or not param_is_not_shared(p):  # (the last stage's copy of a tied embedding)
                continue
            if not getattr(p, "allreduce", True):  # an expert only some ranks hold (Megatron marks it so)
                expert_sq += sum_of_squares(p.grad)
            elif param_is_not_tensor_parallel_duplicate(p):
                sq += sum_of_squares(p.grad)
        if self.tp_size > 1:
            dist.all_reduce(sq, group=ps.get_tensor_model_parallel_group())
        if ps.get_expert_model_parallel_world_size() > 1:  # (experts only split by TP are in ``sq``)
            dist.all_reduce(expert_sq, group=ps.get_expert_tensor_and_model_parallel_group())
        total = sq + expert_sq
        if self.pp_size > 1:
            dist.all_reduce(total, group=ps.get_pipeline_model_parallel_group())
        return float(total.sqrt())

    def microbatch_starting(self, index: int, count: int) -> None:
        """Gradients accumulate in DDP's buffers, zeroed before the first microbatch; every microbatch but the
        last runs under DDP's ``no_sync`` so that, with ``overlap_grad_reduce``, each bucket's reduce starts
        during the last backward only (a context left open by an interrupted step is closed first)."""
        if index == 0:
            release_freed_heap_pages()  # what the passes before left free in glibc's heap (docs/measurements.md)
            self._forward_module.zero_grad_buffer()
            self._end_no_sync()
            if count > 1:
                self._no_sync = contextlib.ExitStack()
                self._no_sync.enter_context(self._forward_module.no_sync())
        if index == count - 1:
            self._end_no_sync()

    def _end_no_sync(self) -> None:
        if self._no_sync is not None:
            self._no_sync.close()
            self._no_sync = None

    def reduce_grads(self) -> None:
        """Megatron's ``finalize_model_grads``: DDP's bucketed reduce over the (expert-)data-parallel group, the
        sum over TP of the gradients each rank holds a part of (norms under sequence parallelism, the MoE
        router, Qwen3's q/k norms), a tied embedding over its first and last pipeline stages. Each optimizer
        parameter's ``.grad`` is then its fp32 ``main_grad`` (a view of DDP's buffer; at bf16 the compute
        copy's), so clipping, the optimizer and a notebook read per-parameter gradients as usual."""
        finalize_model_grads([self._forward_module])
        for param, computed in self._grad_pairs:
            grad = computed.main_grad
            param.grad = grad if grad.dtype == param.dtype else grad.to(param.dtype)

    def release_gradient_buffers(self) -> None:
        self._forward_module.offload_grad_buffers(synchronize=self.device.type == "cuda", empty_cache=False)

    def reallocate_gradient_buffers(self) -> None:
        self._forward_module.restore_grad_buffers(synchronize=False)

    def close(self) -> None:
        """Release the model, Megatron's global parallel state and the default group (a new policy can be
        built after)."""
        super().close()
        if self._forward_module is not None:
            self._forward_module.config.no_sync_func = None  # (set by data_parallel_wrapper: a reference cycle)
        self._forward_module = self.pipeline = None  # DDP around the model: it holds Megatron's process groups
        self._grad_pairs = []
        parallel.destroy_parallel(self._parallel_generation)

    def __repr__(self) -> str:
        a = self.arch
        return (
            f"MegatronAdapter({a.family}, {a.num_layers}x{a.hidden_size}, {self.cfg.precision}, TP={self.tp_size}, "
            f"{f'PP={self.pp_size}, ' if self.pp_size > 1 else ''}"
            f"DP={ps.get_data_parallel_world_size() if self.model is not None else '?'})"
        )
