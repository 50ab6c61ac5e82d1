"""Export the policy as an HF model folder that transformers and vLLM load; with adapters (``policy.lora_cfg``)
the folder holds the merged weights and, in ``adapter/``, the PEFT adapter folder that
``peft.PeftModel.from_pretrained(base, folder / "adapter")`` loads onto the base model (``policy.model_name``)."""

from __future__ import annotations

import shutil
from pathlib import Path

from rlkit.models.safetensors_folder import write_like

ADAPTER_DIR = "adapter"
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "chat_template.jinja", "special_tokens_map.json",
                   "generation_config.json")


def export_hf_folder(policy, source_folder: str | Path, output: str | Path, lora=None) -> Path:
    """Write ``config.json`` and tokenizer files from ``source_folder`` plus the policy's current weights, in
    the source's shard layout. Callers write into a fresh folder (``export_hf`` renames it into place). With
    ``lora`` (an enabled ``policy.lora_cfg``) the weights are the merged ones and the adapters alone go to
    ``output/adapter`` as a PEFT adapter folder whose base is ``source_folder``."""
    source, output = Path(source_folder), Path(output)
    output.mkdir(parents=True, exist_ok=True)
    shutil.copy(source / "config.json", output / "config.json")
    for name in TOKENIZER_FILES:
        if (source / name).is_file():
            shutil.copy(source / name, output / name)
    write_like(policy.export_hf_groups(), source, output)  # the source's shards, one in memory at a time
    if lora is not None and lora.enabled:
        from rlkit.policy.lora import write_adapter_folder

        write_adapter_folder(policy.export_adapter_tensors(), lora, source.resolve(), output / ADAPTER_DIR)
    return output
