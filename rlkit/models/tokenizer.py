"""A character-level tokenizer for synthetic tasks, saved in HF format so transformers and vLLM both load it.

Every printable ASCII character is one token; role markers and EOS are special tokens, so a rendered
arithmetic prompt is a dozen tokens. The tokenizer is built with the `tokenizers` library (a WordLevel model
over single characters, split by a regex pre-tokenizer, joined back by a Fuse decoder) rather than a custom
Python class, because vLLM loads only tokenizers that `AutoTokenizer` can build from files.

The chat template renders ``<|bos|><|user|>{content}<|end|><|assistant|>``; the assistant's reply ends with
``<|end|>``, which is also the EOS token, so generation stops where a turn ends.

:func:`save_tokenizer` writes either this tokenizer or the byte-level BPE of :mod:`rlkit.models.bpe` into a
model folder (``make_model(..., tokenizer="bpe")``).
"""

from __future__ import annotations

import string
from pathlib import Path
from typing import Literal

from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers
from transformers import PreTrainedTokenizerFast

from rlkit.errors import ModelError
from rlkit.models.bpe import BPE_VOCAB_SIZE, save_bpe_tokenizer

SPECIAL_TOKENS = ("<|pad|>", "<|bos|>", "<|end|>", "<|unk|>", "<|system|>", "<|user|>", "<|assistant|>")
CHARACTERS = tuple(string.digits + string.ascii_letters + string.punctuation + " \n")

CHAT_TEMPLATE = (
    "{{ bos_token }}"
    "{% for message in messages %}"
    "{{ '<|' + message['role'] + '|>' + message['content'] + '<|end|>' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|assistant|>' }}{% endif %}"
)


def build_char_tokenizer() -> PreTrainedTokenizerFast:
    """The character tokenizer with its chat template; ``len(tok)`` is 103."""
    vocab = {tok: i for i, tok in enumerate(SPECIAL_TOKENS + CHARACTERS)}  # special tokens first (pad is 0)
    core = Tokenizer(models.WordLevel(vocab=vocab, unk_token="<|unk|>"))
    core.pre_tokenizer = pre_tokenizers.Split(Regex("."), behavior="isolated")
    core.decoder = decoders.Fuse()
    core.add_special_tokens(list(SPECIAL_TOKENS))
    tok = PreTrainedTokenizerFast(
        tokenizer_object=core,
        bos_token="<|bos|>",
        eos_token="<|end|>",
        pad_token="<|pad|>",
        unk_token="<|unk|>",
        additional_special_tokens=["<|system|>", "<|user|>", "<|assistant|>"],
    )
    tok.chat_template = CHAT_TEMPLATE
    return tok


TokenizerKind = Literal["char", "bpe"]


def tokenizer_vocab_size(kind: TokenizerKind) -> int:
    """Rows a model's embedding needs for ``kind`` (a multiple of 128, like the presets' vocabularies)."""
    sizes = {"char": 128, "bpe": BPE_VOCAB_SIZE}
    if kind not in sizes:
        raise ModelError(f"unknown tokenizer {kind!r}; choose 'char' (one token per character, the quickstart's) "
                         "or 'bpe' (byte-level BPE with a ChatML template, like Qwen's)")
    return sizes[kind]


def save_tokenizer(folder: str | Path, kind: TokenizerKind = "char") -> PreTrainedTokenizerFast:
    """Write the ``kind`` tokenizer's files into a model folder (after the model's own files: the BPE one
    replaces ``generation_config.json`` to list both of its EOS ids)."""
    tokenizer_vocab_size(kind)  # an unknown kind is refused before anything is written
    if kind == "bpe":
        return save_bpe_tokenizer(folder)
    tok = build_char_tokenizer()
    tok.save_pretrained(str(folder))
    return tok
