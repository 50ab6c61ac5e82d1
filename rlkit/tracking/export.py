"""Export the policy as an HF model folder that transformers and vLLM load."""

from __future__ import annotations

import shutil
from pathlib import Path

from rlkit.models.safetensors_folder import write_like

TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "chat_template.jinja", "special_tokens_map.json",
                   "generation_config.json")


def export_hf_folder(policy, source_folder: str | Path, output: str | Path) -> Path:
    """Write ``config.json`` and tokenizer files from ``source_folder`` plus the policy's current weights, in
    the source's shard layout. Callers write into a fresh folder (``export_hf`` renames it into place)."""
    source, output = Path(source_folder), Path(output)
    output.mkdir(parents=True, exist_ok=True)
    shutil.copy(source / "config.json", output / "config.json")
    for name in TOKENIZER_FILES:
        if (source / name).is_file():
            shutil.copy(source / name, output / name)
    write_like(policy.export_hf_groups(), source, output)  # the source's shards, one in memory at a time
    return output
