"""A policy's checkpoint state: a distributed checkpoint (``torch.distributed.checkpoint``) in safetensors.

Every rank writes its own shard file in parallel through DCP's Hugging Face storage writer, so a Ray worker
group saves without gathering anything, and the files are safetensors (no pickle: a checkpoint may come
from someone else). Tensors are keyed ``model/<name>``, ``reference/<name>`` (only while the reference is resident,
:mod:`rlkit.policy.reference`; else ``policy.json`` names the model folder it reloads from) and
``optimizer/<name>/<state>`` with names unique per distinct shard: replicated copies (data parallelism) share a key and DCP writes one of
them; tensor-parallel shards carry their rank; FSDP2's DTensors carry their own placement, so DCP cuts and
reassembles them itself. ``policy.json`` (rank 0) holds the rest: the parallel layout, the version, the
optimizer's hyperparameters and the schedule.

A checkpoint loads only under the layout it was written with: Megatron's fused SwiGLU weight
(``[gate shard; up shard]`` per rank) is not a plain split of one tensor, so a different tensor-parallel size
would load wrong weights without an error. The check runs before anything loads. Resuming under another
layout goes through HF weights (``rlkit export-hf``) and a fresh optimizer.

Deliberate simplification: RNG states of worker ranks are not kept (the models have no dropout; the
driver's RNG is in the session checkpoint).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from torch import Tensor

from rlkit.errors import CheckpointError

FORMAT = "rlkit-policy-state"
FORMAT_VERSION = 1
SHARDS = "shards"
STATE_FILE = "policy.json"


class CheckpointLayoutError(CheckpointError):
    """A checkpoint written under another parallel layout than the policy loading it."""


def _named_tensors(policy: Any) -> dict[str, tuple[str, Tensor]]:
    """Checkpoint key -> (parameter name, parameter) for this rank's parameters; with adapters
    (``policy.lora_cfg``) the adapters alone: the frozen base is the model folder's, loaded at build."""
    params = dict(policy.model.named_parameters())
    adapters = policy.cfg.lora_cfg.enabled
    return {key: (name, params[name]) for name, key in policy.checkpoint_names().items()
            if not adapters or params[name].requires_grad}


def _layout(policy: Any) -> dict:
    """The parallel layout, and with adapters their shape (a checkpoint of other adapters is refused)."""
    from rlkit.policy.lora import adapter_config_summary

    layout = dict(policy.parallel_layout())
    if policy.cfg.lora_cfg.enabled:
        layout["lora"] = adapter_config_summary(policy.cfg.lora_cfg)
    return layout


def save_policy_state(policy: Any, folder: Path) -> None:
    """Every rank of ``policy`` writes its shard of weights, reference and optimizer state into ``folder``
    (all ranks must call this together); rank 0 also writes ``policy.json``."""
    from torch.distributed.checkpoint import HuggingFaceStorageWriter, save

    tensors: dict[str, Tensor] = {}
    reference = policy.reference
    for key, (name, param) in _named_tensors(policy).items():
        tensors[f"model/{key}"] = param.detach()
        if reference.tensors is not None:
            tensors[f"reference/{key}"] = reference.tensors[name]
        for state_name, value in policy.optimizer.state.get(param, {}).items():
            if not isinstance(value, Tensor):
                raise CheckpointError(f"optimizer state {state_name!r} of {name} is not a tensor; cannot save it")
            tensors[f"optimizer/{key}/{state_name}"] = value
    folder.mkdir(parents=True, exist_ok=True)
    save(tensors, storage_writer=HuggingFaceStorageWriter(str(folder / SHARDS), save_distributed=True),
         no_dist=not dist.is_initialized())
    if not dist.is_initialized() or dist.get_rank() == 0:
        groups = [{k: v for k, v in g.items() if k != "params"} for g in policy.optimizer.state_dict()["param_groups"]]
        meta = {"format": FORMAT, "format_version": FORMAT_VERSION, "layout": _layout(policy),
                "policy_version": policy.version, "param_groups": groups, "scheduler": policy.scheduler.state_dict(),
                "reference_folder": reference.folder if reference.tensors is None else None}
        (folder / STATE_FILE).write_text(json.dumps(meta, indent=1))


def read_policy_meta(folder: Path) -> dict[str, Any]:
    """``policy.json`` of a policy checkpoint folder, checked to be one."""
    try:
        meta = json.loads((Path(folder) / STATE_FILE).read_text())
    except (OSError, json.JSONDecodeError) as e:
        raise CheckpointError(f"{folder}/{STATE_FILE} is missing or unreadable ({e}); use an earlier checkpoint") from e
    if meta.get("format") != FORMAT or meta.get("format_version", 0) > FORMAT_VERSION:
        raise CheckpointError(f"{folder} holds no rlkit policy state of format version <= {FORMAT_VERSION}")
    return meta


def load_policy_state(policy: Any, folder: Path) -> None:
    """Load what :func:`save_policy_state` wrote into ``policy`` (all ranks together). Refuses another layout
    or architecture before anything is loaded."""
    from torch.distributed.checkpoint import HuggingFaceStorageReader, load

    meta = read_policy_meta(folder)
    written, layout = meta["layout"], _layout(policy)
    if written != layout:
        differ = ", ".join(f"{k}: {written.get(k)} -> {layout.get(k)}" for k in sorted(set(written) | set(layout))
                           if written.get(k) != layout.get(k))
        raise CheckpointLayoutError(
            f"{folder} was written under another parallel layout ({differ}); resume with the layout it was saved "
            f"under, or export its weights (rlkit export-hf) and start a new run from them")
    reader = HuggingFaceStorageReader(str(folder / SHARDS))
    saved = reader.read_metadata().state_dict_metadata
    named = _named_tensors(policy)
    with_reference = any(k.startswith("reference/") for k in saved)
    parts = ("model", "reference") if with_reference else ("model",)
    expected = {f"{part}/{key}" for key in named for part in parts}
    present = {k for k in saved if not k.startswith("optimizer/")}
    whole = not dist.is_initialized() or dist.get_world_size() == 1  # else each rank sees its own shards only
    if not expected <= present or (whole and expected != present):
        diff = sorted(expected ^ present)[:5]
        raise CheckpointError(f"{folder}: parameter names differ from this model's (e.g. {diff}); the checkpoint was "
                              "written for another architecture")
    template: dict[str, Tensor] = {}
    for key, (_, param) in named.items():
        template[f"model/{key}"] = torch.empty_like(param.detach())
        if with_reference and policy.reference.wanted is not False:  # (a reference nobody uses is not read)
            template[f"reference/{key}"] = torch.empty_like(param.detach())
        for saved_key in (k for k in saved if k.startswith(f"optimizer/{key}/")):
            size = saved[saved_key].size
            template[saved_key] = (torch.empty_like(param.detach()) if tuple(size) == tuple(param.shape)
                                   else torch.empty(size, dtype=saved[saved_key].properties.dtype))
    load(template, storage_reader=reader, no_dist=not dist.is_initialized())
    _apply(policy, named, template, meta)


def _apply(policy: Any, named: dict, template: dict[str, Tensor], meta: dict) -> None:
    with torch.no_grad():
        for key, (_, param) in named.items():
            param.copy_(template[f"model/{key}"])
    held = any(k.startswith("reference/") for k in template)
    policy.reference.restore(meta.get("reference_folder"),
                             {name: template[f"reference/{key}"] for key, (name, _) in named.items()} if held else None)
    live = policy.optimizer.state_dict()
    index = {id(p): i for group, live_group in zip(policy.optimizer.param_groups, live["param_groups"])
             for p, i in zip(group["params"], live_group["params"])}
    state = {}
    for key, (_, param) in named.items():
        entries = {k.rsplit("/", 1)[1]: v for k, v in template.items() if k.startswith(f"optimizer/{key}/")}
        if entries:
            state[index[id(param)]] = entries
    if len(meta["param_groups"]) != len(live["param_groups"]):
        raise CheckpointError(f"the checkpoint's optimizer has {len(meta['param_groups'])} parameter groups, this "
                              f"policy's has {len(live['param_groups'])}")
    groups = [dict({k: tuple(v) if isinstance(g.get(k), tuple) else v for k, v in saved.items()}, params=g["params"])
              for saved, g in zip(meta["param_groups"], live["param_groups"])]
    policy.optimizer.load_state_dict({"state": state, "param_groups": groups})
    policy.scheduler.load_state_dict(meta["scheduler"])
    policy.version = meta["policy_version"]
