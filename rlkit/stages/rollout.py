"""Rollout stage: render a batch of prompts with the chat template and sample G completions each."""

from __future__ import annotations

from typing import Any, Sequence

from rlkit.data import render_prompt_texts
from rlkit.generation.base import Generator, SamplingSettings
from rlkit.stages.batching import trajectories_from_generation
from rlkit.stages.settings import RolloutSettings
from rlkit.trajectories import Trajectories


def rollout(generator: Generator, tokenizer: Any, rows: Sequence[dict[str, Any]], sampling: SamplingSettings,
            policy_version: int, settings: RolloutSettings = RolloutSettings()) -> Trajectories:
    """``len(rows)`` prompts x ``settings.num_generations`` samples -> Trajectories (no rewards yet)."""
    texts = render_prompt_texts(tokenizer, [r[settings.prompt_key] for r in rows], settings.system_prompt, settings.tools,
                                settings.chat_template_kwargs)
    ids = [tokenizer(t, add_special_tokens=False)["input_ids"] for t in texts]
    generation = generator.generate(ids, settings.num_generations, sampling)
    batch = trajectories_from_generation(generation, tokenizer.pad_token_id, texts, rows, policy_version, tokenizer)
    return batch.with_(info={"sampling_seed": sampling.seed})
