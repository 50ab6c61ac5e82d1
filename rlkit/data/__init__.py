"""Prompt data: datasets (generated, from files, or by name via datasets.load_dataset), chat-template rendering,
resumable sampling, SFT batches."""

from rlkit.data.chat import render_prompt_texts, render_prompts
from rlkit.data.prompts import DataParams, load_prompt_dataset
from rlkit.data.sampler import PromptSampler
from rlkit.data.sft import SFTBatch, build_sft_batch

__all__ = [
    "DataParams",
    "PromptSampler",
    "SFTBatch",
    "build_sft_batch",
    "load_prompt_dataset",
    "render_prompt_texts",
    "render_prompts",
]
