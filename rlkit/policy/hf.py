"""The plain transformers backend: an HF causal LM trained in this process, unsharded.

Why: the simplest policy there is, for debugging a loss. transformers' own model of the folder, no process
group, no sharding and no weight conversion (the HF names are the parameter names). :class:`HFAdapter` is written
against :class:`rlkit.policy.adapter.ModelAdapter` alone; the loop, optimizer step, reference and checkpoints are
:class:`rlkit.policy.in_process.InProcessPolicy`'s. Chosen with ``policy.backend=hf``. The DTensor backend
(:class:`rlkit.policy.dtensor.DTensorAdapter`) is this model sharded with FSDP2, so the methods here accept
DTensor parameters (each rank then handles its shard).

Numerics: logits divided by the sampling temperature, logprobs and entropy from one log-softmax over the full
vocabulary in fp32, the gradient norm over all parameters in float64.

Deliberate simplifications: one process (``policy.num_workers=1``), dense models only (transformers 5 holds
Mixtral's experts fused under names that differ from the checkpoint's), float32 only (``policy.precision``,
checked at validation).
"""

from __future__ import annotations

import re
from typing import Iterator, Mapping, Optional

import torch
from torch import Tensor
from torch.distributed.tensor import distribute_tensor

from rlkit.config.components import PolicyConfig
from rlkit.errors import ModelError
from rlkit.models.families import BY_NAME
from rlkit.policy import packed_attention
from rlkit.policy.architecture import Architecture
from rlkit.policy.adapter import ModelAdapter
from rlkit.policy.lora import hf_name_of_peft_param, inject_peft, merged, peft_file_name
from rlkit.policy.optimizer import sum_of_squares
from rlkit.policy.packing import PackedRows
from rlkit.weights import HFGroup

_LAYER = re.compile(r"^model\.layers\.(\d+)\.")


def load_causal_lm(cfg: PolicyConfig, device: torch.device, checkpointing: bool = False) -> torch.nn.Module:
    """transformers' model of ``cfg.model_name`` on ``device``, fp32 (bf16 when ``cfg.pure_bf16``); with sequence packing its attention is
    rlkit's registered per-row attention (:mod:`rlkit.policy.packed_attention`), else SDPA. With
    ``checkpointing`` (the backend section's ``activation_checkpointing``) each decoder layer keeps only its input in training and recomputes the rest in
    backward (transformers' own checkpointing, non-reentrant: it composes with FSDP2 and frozen base weights)."""
    from transformers import AutoModelForCausalLM

    attention = packed_attention.register() if cfg.sequence_packing.enabled else "sdpa"
    model = AutoModelForCausalLM.from_pretrained(cfg.model_name, attn_implementation=attention,
                                                 dtype=torch.bfloat16 if cfg.pure_bf16 else torch.float32)
    if checkpointing:
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    return model.to(device)


class HFAdapter(ModelAdapter):
    """A causal LM from an HF folder in this process."""

    _peft = None  # with policy.lora_cfg: peft's PeftModel around ``model`` (whose linears peft adapted in place)

    def __init__(self, cfg: PolicyConfig, seed: int = 0):
        self._setup(cfg)
        torch.manual_seed(seed)
        self.model = self._with_adapters(load_causal_lm(cfg, self.device, cfg.hf_cfg.activation_checkpointing))

    def _with_adapters(self, model: torch.nn.Module) -> torch.nn.Module:
        """``model`` with peft's LoRA layers on it when ``policy.lora_cfg.enabled`` (base weights frozen)."""
        if self.cfg.lora_cfg.enabled:
            self._peft = inject_peft(model, self.cfg.lora_cfg)
        return model

    def _setup(self, cfg: PolicyConfig) -> None:
        """Config, architecture (a dense model) and device."""
        self.cfg = cfg
        self.arch = Architecture.from_hf_folder(cfg.model_name)
        if BY_NAME[self.arch.family].moe:
            raise ModelError(f"{type(self).__name__} does not train Mixture-of-Experts models yet "
                             "(transformers holds the experts fused, under other names than the checkpoint's); "
                             "use policy.megatron_cfg")
        self.device = torch.device("cuda", torch.cuda.current_device()) if torch.cuda.is_available() else torch.device("cpu")

    # ---- weights ----------------------------------------------------------------------------------
    def copy_hf_state(self, hf: Mapping[str, Tensor]) -> None:
        """Copy HF-named full tensors (a DTensor parameter keeps this rank's shard). Strict on names and shapes."""
        params = self._hf_params()
        missing = sorted(set(params) - set(hf))
        if missing:
            raise KeyError(f"no HF weights for parameters {missing[:5]}")
        with torch.no_grad():
            for name, param in params.items():
                if tuple(hf[name].shape) != tuple(param.shape):
                    raise ValueError(f"{name}: HF weights have shape {tuple(hf[name].shape)}, model has {tuple(param.shape)}")
                full = hf[name].to(self.device, param.dtype)
                sharded = hasattr(param, "placements")
                param.copy_(distribute_tensor(full, param.device_mesh, param.placements) if sharded else full)

    def export_hf_groups(self) -> Iterator[HFGroup]:
        """HF-named full tensors: embeddings, each decoder layer, then final norm and head. Gathering a DTensor
        is a collective, so every rank must iterate in step. Unsharded they alias the live weights: copy them
        if you keep them past the next optimizer step."""
        groups: dict[str, list[tuple[str, Tensor]]] = {}
        for name, param in self._hf_params().items():
            m = _LAYER.match(name)
            key = f"layer{int(m.group(1)):06d}" if m else ("0embed" if "embed_tokens" in name else "zfinal")
            groups.setdefault(key, []).append((name, param))
        adapted, scaling = self._adapted_linears(), self.cfg.lora_cfg.scaling
        for key in sorted(groups):
            yield [(name, merged(*map(_full_tensor, adapted[name]), scaling) if name in adapted
                    else _full_tensor(param)) for name, param in groups[key]]

    # ---- adapters (policy.lora_cfg) ----------------------------------------------------------------
    def _hf_params(self) -> dict[str, Tensor]:
        """HF name -> base parameter (every parameter without adapters)."""
        return {hf: p for name, p in self.model.named_parameters() if (hf := hf_name_of_peft_param(name))}

    def _adapted_linears(self) -> dict[str, tuple[Tensor, Tensor, Tensor]]:
        """HF weight name -> (base weight, lora_A, lora_B) of each adapted linear (empty without adapters)."""
        params = dict(self.model.named_parameters())
        parts = ("base_layer.weight", "lora_A.default.weight", "lora_B.default.weight")
        return {hf_name_of_peft_param(name): tuple(params[name.removesuffix(parts[0]) + part] for part in parts)
                for name in params if name.endswith("." + parts[0])}

    def adapters_disabled(self):
        return self._peft.disable_adapter()

    def export_adapter_tensors(self) -> Iterator[tuple[str, Tensor]]:
        """The adapters as full tensors under their PEFT file names (collective under FSDP: every rank calls)."""
        for name, param in self.model.named_parameters():
            if ".lora_" in name:
                yield peft_file_name(name), _full_tensor(param).clone()

    def parallel_layout(self) -> dict[str, int | str]:
        return {"backend": "hf", "data_parallel_size": 1}

    def checkpoint_names(self) -> dict[str, str]:
        return {name: name for name, _ in self.model.named_parameters()}  # (DTensors carry their own placement)

    # ---- logprobs and training --------------------------------------------------------------------
    def rows_group(self):
        return None  # this process holds every row

    def logits(self, input_ids: Tensor) -> Tensor:
        """input_ids [b, T] -> logits [b, T, V] (right padding needs no mask: a causal model never looks at later
        positions)."""
        return self.model(input_ids=input_ids.to(self.device), use_cache=False).logits

    def packed_logits(self, packed: PackedRows) -> Tensor:
        """Packed rows -> logits [1, L, V]: position_ids restart per row (RoPE), and the registered
        attention (:mod:`rlkit.policy.packed_attention`) runs each row's segment of ``cu_seq_lens_q`` alone."""
        return self.model(input_ids=packed.input_ids.to(self.device), position_ids=packed.position_ids.to(self.device),
                          cu_seq_lens_q=packed.cu_seqlens.to(self.device), use_cache=False).logits

    def token_logprobs_and_entropy(self, logits: Tensor, input_ids: Tensor,
                                   with_entropy: bool) -> tuple[Tensor, Optional[Tensor]]:
        """One log-softmax over the full vocabulary (in fp32) for both."""
        logp = torch.log_softmax(logits[:, :-1].float(), dim=-1)
        token = torch.nn.functional.pad(logp.gather(-1, input_ids[:, 1:, None]).squeeze(-1), (1, 0))
        if not with_entropy:
            return token, None
        with torch.no_grad():
            return token, torch.nn.functional.pad(-(logp.exp() * logp).sum(-1), (1, 0))

    def grad_norm(self) -> float:
        sq = torch.zeros((), dtype=torch.float64, device=self.device)
        for p in self.model.parameters():
            if p.grad is not None:  # (this rank's shard of a DTensor gradient)
                sq += sum_of_squares(p.grad.to_local() if hasattr(p.grad, "to_local") else p.grad)
        if self.dp_size > 1:
            torch.distributed.all_reduce(sq)  # FSDP shards are disjoint: the squares add up
        return float(sq.sqrt())

    def __repr__(self) -> str:
        a = self.arch
        return f"HFAdapter({a.family}, {a.num_layers}x{a.hidden_size}, one process)"


def _full_tensor(param: Tensor) -> Tensor:
    t = param.detach()
    return t.full_tensor() if hasattr(t, "full_tensor") else t
