"""Checks of a model folder's files, cheap enough to run before anything loads them.

A user's folder can hold a hand-edited ``config.json`` or a weights file cut short by a full disk or an
interrupted copy. Found late, these surface as a ``JSONDecodeError`` or a safetensors error from inside an
engine worker, tens of seconds into a start. Here each becomes a ``ModelError`` naming the file and the fix.
A safetensors file is checked by reading its header only (``safe_open`` compares the header's offsets with
the file's size, so a truncated file fails there); no tensor is loaded.

Deliberate simplification: ``*.bin`` (pickle) weights are not checked; rlkit writes safetensors only.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from safetensors import SafetensorError, safe_open

from rlkit.errors import ModelError

INDEX_FILE = "model.safetensors.index.json"


def read_json_object(path: Path, what: str) -> dict[str, Any]:
    """``path`` parsed as a JSON object, or a ``ModelError`` naming the file, the line and the fix."""
    try:
        value = json.loads(path.read_text(encoding="utf-8"))
    except json.JSONDecodeError as exc:
        raise ModelError(f"{what} {str(path)!r} is not valid JSON (line {exc.lineno}, column {exc.colno}: "
                         f"{exc.msg}). Fix: repair the file, or re-create the model folder.") from None
    except UnicodeDecodeError as exc:
        raise ModelError(f"{what} {str(path)!r} is not UTF-8 text ({exc.reason} at byte {exc.start}). "
                         "Fix: repair the file, or re-create the model folder.") from None
    if not isinstance(value, dict):
        raise ModelError(f"{what} {str(path)!r} holds a JSON {type(value).__name__}, not an object of settings. "
                         "Fix: repair the file, or re-create the model folder.")
    return value


def check_weight_files(folder: str | Path) -> None:
    """Every ``*.safetensors`` file in ``folder`` has a readable header that covers the file, and the shard
    index (when there is one) names only files that exist."""
    folder = Path(folder)
    for file in sorted(folder.glob("*.safetensors")):
        try:
            with safe_open(str(file), framework="numpy"):  # (the header only; "pt" would import torch)
                pass
        except (SafetensorError, OSError) as exc:
            raise ModelError(f"weights file {str(file)!r} is unreadable ({exc}); it is probably truncated by an "
                             "interrupted copy or a full disk. Fix: copy or export the model again.") from None
    index = folder / INDEX_FILE
    if index.is_file():
        weight_map = read_json_object(index, "shard index").get("weight_map") or {}
        missing = sorted({f for f in weight_map.values() if not (folder / f).is_file()})
        if missing:
            raise ModelError(f"shard index {str(index)!r} names missing weights file(s) {missing}. "
                             "Fix: copy the complete model folder.")


def num_experts_of(hf_config: dict) -> int:
    """Routed experts per MoE layer of an HF config (Mixtral's ``num_local_experts``, Qwen's ``num_experts``,
    DeepSeek's ``n_routed_experts``); 0 for a dense model."""
    return int(hf_config.get("num_local_experts") or hf_config.get("num_experts") or hf_config.get("n_routed_experts")
               or 0)
