"""Tiny HF-format models and the character tokenizer, made offline."""

from rlkit.models.factory import PRESETS, TinyModelSpec, check_head_dim, make_model, read_hf_config
from rlkit.models.tokenizer import build_char_tokenizer

__all__ = ["PRESETS", "TinyModelSpec", "build_char_tokenizer", "check_head_dim", "make_model", "read_hf_config"]
