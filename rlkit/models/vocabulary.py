"""The tokenizer's vocabulary against the model's: a tokenizer with more tokens than the model has embedding rows.

Why checked before any engine starts: a token id at or past the model's ``vocab_size`` indexes past its embedding,
which surfaces as a bare ``IndexError`` (or a CUDA device-side assert) from inside the first forward, after the
policy and the generator have both started. The other way round is normal: models pad their vocabulary past the
tokenizer's (to a multiple of 64 or 128), and those padding ids have no text (see
:func:`rlkit.notebook.display.undecodable_token`).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from rlkit.errors import ModelError
from rlkit.models.factory import read_hf_config


def check_tokenizer_fits(tokenizer: Any, model_name: str | Path) -> None:
    """Raise ``ModelError`` when ``tokenizer`` has ids the model folder's embedding has no row for (config.json's
    ``vocab_size``, or a multimodal config's ``text_config``'s)."""
    config = read_hf_config(model_name, check_weights=False)
    vocab = config.get("vocab_size", (config.get("text_config") or {}).get("vocab_size"))
    size = len(tokenizer)
    if vocab is None or size <= vocab:
        return
    raise ModelError(f"the tokenizer of {str(model_name)!r} has {size} tokens (ids 0-{size - 1}) but the model's "
                     f"vocabulary (config.json vocab_size) has {vocab} rows, so ids {vocab}-{size - 1} would index "
                     "past its embedding. Fix: use the tokenizer the model was made with; or, after adding tokens, "
                     "resize the embeddings (model.resize_token_embeddings(len(tokenizer))) and save the model and "
                     "tokenizer together")
