"""Export the policy as an HF model folder that transformers and vLLM load."""

from __future__ import annotations

import shutil
from pathlib import Path

from safetensors.torch import save_file

TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "chat_template.jinja", "special_tokens_map.json",
                   "generation_config.json")


def export_hf_folder(policy, source_folder: str | Path, output: str | Path) -> Path:
    """Write ``config.json`` and tokenizer files from ``source_folder`` plus the policy's current weights."""
    source, output = Path(source_folder), Path(output)
    output.mkdir(parents=True, exist_ok=True)
    shutil.copy(source / "config.json", output / "config.json")
    for name in TOKENIZER_FILES:
        if (source / name).is_file():
            shutil.copy(source / name, output / name)
    tensors = {name: t.contiguous() for name, t in policy.hf_state_dict().items()}
    tmp = output / "model.safetensors.tmp"
    save_file(tensors, str(tmp), metadata={"format": "pt"})
    tmp.replace(output / "model.safetensors")
    return output
