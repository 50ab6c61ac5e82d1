"""A GGUF file (llama.cpp's format) as an ordinary HF safetensors folder that every rlkit backend loads.

Why: GGUF is how small pretrained models often travel (a PyPI wheel can carry one; no model hub is needed), and
transformers reads it (``from_pretrained(folder, gguf_file=...)``, dequantized to fp32 with the ``gguf``
package), but a model loaded that way cannot be saved ("quantized with QuantizationMethod.GGUF and is not
serializable"), and vLLM and the Megatron converter read safetensors folders. So the conversion loads the GGUF
through transformers once, writes the state dict, the config without its quantization entry, the tokenizer with
its chat template and a generation config with the EOS ids itself, then loads the written folder back with
transformers and compares its logits with the GGUF load's on a probe text (bound relative to the logits' scale).

The folder is written beside its destination and renamed into place when complete, so an interrupted conversion
leaves nothing that looks finished; ``rlkit-conversion.json`` in it records the source, its SHA-256, the dtype and
the check.

Deliberate simplifications: the weights are the GGUF's dequantized values (a Q4 file gives a model that is
exactly the quantized one, not the original bf16 checkpoint); only the families rlkit's policy supports
(:mod:`rlkit.models.families`) are accepted; one ``model.safetensors`` file (no shards: fine to a few GB).
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Literal

from rlkit.errors import ModelError
from rlkit.models.compare import LogitsAgreement, logits_agreement
from rlkit.models.factory import count_parameters
from rlkit.models.families import SUPPORTED_ARCHITECTURES, family_of

Dtype = Literal["float32", "bfloat16"]
RECORD_FILE = "rlkit-conversion.json"
PROBE_MESSAGES = [{"role": "user", "content": "What is 47 + 38? Answer with just the number."}]
# fp32: the written folder holds the very tensors transformers dequantized, so its logits agree to rounding in
# the matmuls' order; relative to the largest |logit| (~40 on SmolLM2), 1e-6 still leaves two orders of margin
# over fp32 rounding (~1e-7 relative) and catches any wrong tensor (>1e-2).
_RELATIVE_BOUND = 1e-6


@dataclass(frozen=True)
class Conversion:
    """What :func:`convert_gguf` wrote and how well the written folder reproduces transformers' GGUF load."""

    folder: Path
    source: str  # the GGUF file
    sha256: str  # of the GGUF file
    dtype: Dtype
    architecture: str  # config.json's "architectures"[0]
    num_parameters: int  # stored (a tied head once)
    eos_token_ids: tuple[int, ...]
    check: LogitsAgreement  # written folder vs GGUF load, on the probe prompt
    seconds: float

    def record(self) -> dict:
        out = asdict(self)
        out["folder"], out["check"] = str(self.folder), self.check.as_dict()
        return out


def file_sha256(path: str | Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 22), b""):
            digest.update(block)
    return digest.hexdigest()


def convert_gguf(gguf_file: str | Path, folder: str | Path, dtype: Dtype = "float32") -> Conversion:
    """Write ``gguf_file`` as an HF safetensors folder at ``folder`` (which must not exist yet) and check it.

    Raises ModelError for a missing file, a missing ``gguf`` package, an architecture rlkit does not train, or a
    written folder whose logits do not reproduce the GGUF load's."""
    t0 = time.perf_counter()
    gguf_file, folder = Path(gguf_file).expanduser().resolve(), Path(folder).expanduser()
    if dtype not in ("float32", "bfloat16"):
        raise ModelError(f"dtype={dtype!r}: choose float32 or bfloat16")
    if not gguf_file.is_file():
        raise ModelError(f"GGUF file {str(gguf_file)!r} does not exist. Fix: check the path")
    if folder.exists():
        raise ModelError(f"{str(folder)!r} already exists; the conversion writes a new folder. Fix: choose another "
                         "folder, or delete this one first")
    try:
        import gguf  # noqa: F401 - transformers' GGUF reader needs it; say so before a long load
    except ImportError:
        raise ModelError("reading GGUF needs the `gguf` package. Fix: pip install 'rlkit[real-model]' "
                         "(or pip install gguf==0.19.0)") from None
    sha = file_sha256(gguf_file)
    tokenizer, model = _load_gguf(gguf_file)
    architecture = type(model).__name__
    if family_of([architecture]) is None:
        raise ModelError(f"{gguf_file.name}: architecture {architecture} is not one rlkit's policy trains "
                         f"(supported: {', '.join(SUPPORTED_ARCHITECTURES)})")
    partial = folder.with_name(f".{folder.name}.partial-{os.getpid()}")
    shutil.rmtree(partial, ignore_errors=True)
    try:
        eos = _write_folder(model, tokenizer, partial, dtype)
        check = _check_folder(model, tokenizer, partial, dtype)
        conversion = Conversion(folder, str(gguf_file), sha, dtype, architecture, count_parameters(partial), eos,
                                check, time.perf_counter() - t0)
        (partial / RECORD_FILE).write_text(json.dumps(conversion.record(), indent=2) + "\n")
        folder.parent.mkdir(parents=True, exist_ok=True)
        partial.rename(folder)
    finally:
        shutil.rmtree(partial, ignore_errors=True)
    return conversion


def read_conversion(folder: str | Path) -> dict | None:
    """The record a finished conversion left in ``folder``, or None."""
    path = Path(folder) / RECORD_FILE
    try:
        return json.loads(path.read_text())
    except (OSError, json.JSONDecodeError):
        return None


def _load_gguf(gguf_file: Path):
    import torch
    import transformers as tf

    kwargs = dict(gguf_file=gguf_file.name)
    try:
        tokenizer = tf.AutoTokenizer.from_pretrained(str(gguf_file.parent), **kwargs)
        model = tf.AutoModelForCausalLM.from_pretrained(str(gguf_file.parent), dtype=torch.float32, **kwargs)
    except (ValueError, KeyError, RuntimeError) as exc:
        raise ModelError(f"transformers could not read {gguf_file.name} ({type(exc).__name__}: "
                         f"{str(exc).splitlines()[0] if str(exc) else ''}). Fix: use a GGUF of a Llama or Qwen "
                         "model that transformers' GGUF reader supports") from None
    return tokenizer, model.eval()


def _write_folder(model, tokenizer, folder: Path, dtype: Dtype) -> tuple[int, ...]:
    """config.json, model.safetensors, tokenizer files, generation_config.json; returns the EOS ids."""
    import torch
    from safetensors.torch import save_file
    from transformers import GenerationConfig

    folder.mkdir(parents=True)
    config = model.config.to_dict()
    for key in ("quantization_config", "_name_or_path", "_model_name_or_path", "transformers_version"):
        config.pop(key, None)
    config.update(architectures=[type(model).__name__], dtype=dtype)
    (folder / "config.json").write_text(json.dumps(config, indent=2, sort_keys=True) + "\n")
    state = model.state_dict()
    if config.get("tie_word_embeddings"):
        state.pop("lm_head.weight", None)  # stored once, as the embedding (what transformers itself saves)
    save_file({k: v.detach().to(getattr(torch, dtype)).contiguous() for k, v in state.items()},
              str(folder / "model.safetensors"), metadata={"format": "pt"})
    tokenizer.save_pretrained(str(folder))
    eos = tuple(dict.fromkeys(i for i in (tokenizer.eos_token_id, config.get("eos_token_id")) if isinstance(i, int)))
    if not eos:
        raise ModelError("the GGUF names no end-of-sequence token; rlkit needs one to stop generation")
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else eos[0]
    GenerationConfig(bos_token_id=config.get("bos_token_id"), eos_token_id=list(eos),
                     pad_token_id=pad).save_pretrained(str(folder))
    return eos


def _check_folder(reference, tokenizer, folder: Path, dtype: Dtype) -> LogitsAgreement:
    """The written folder, loaded back by transformers, against the GGUF load (its weights rounded to ``dtype``
    first, so both compute the same function in fp32) on the probe prompt."""
    import torch
    from transformers import AutoModelForCausalLM

    ids = tokenizer.apply_chat_template(PROBE_MESSAGES, add_generation_prompt=True, return_tensors="pt",
                                        return_dict=True)["input_ids"]
    written = AutoModelForCausalLM.from_pretrained(str(folder), dtype=torch.float32).eval()
    with torch.no_grad():
        if dtype != "float32":
            for p in reference.parameters():
                p.copy_(p.to(getattr(torch, dtype)).float())
        expected, got = reference(ids).logits[0], written(ids).logits[0]
    agreement = logits_agreement(got, expected, relative_bound=_RELATIVE_BOUND)
    if not agreement.ok:
        raise ModelError(f"the written folder does not reproduce transformers' GGUF load: {agreement}. This is a bug "
                         "in the conversion; please report it with the GGUF file's name")
    return agreement

