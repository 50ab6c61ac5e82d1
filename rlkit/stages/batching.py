"""Turn generator output (ragged token lists) into the padded :class:`Trajectories` batch."""

from __future__ import annotations

from typing import Any, Sequence

import torch

from rlkit.generation.base import Generation
from rlkit.trajectories import Trajectories


def trajectories_from_generation(
    generation: Generation,
    pad_token_id: int,
    prompts: Sequence[str],
    rows: Sequence[dict[str, Any]] = (),
    policy_version: int = 0,
) -> Trajectories:
    """Right-pad prompt + completion of each sample to ``[B, T]`` and place the generator's logprobs on the
    completion tokens. ``prompts`` are the ``N`` rendered prompt texts; sample ``i`` belongs to prompt
    ``i // G``."""
    g = generation.group_size
    b = len(generation.token_ids)
    lengths = [len(generation.prompt_token_ids[i // g]) + len(generation.token_ids[i]) for i in range(b)]
    t = max(lengths)
    input_ids = torch.full((b, t), pad_token_id, dtype=torch.long)
    attention_mask = torch.zeros((b, t), dtype=torch.bool)
    loss_mask = torch.zeros((b, t), dtype=torch.bool)
    logprobs = torch.zeros((b, t), dtype=torch.float32)
    for i in range(b):
        prompt, completion = generation.prompt_token_ids[i // g], generation.token_ids[i]
        p, c = len(prompt), len(completion)
        input_ids[i, : p + c] = torch.tensor(list(prompt) + list(completion), dtype=torch.long)
        attention_mask[i, : p + c] = True
        loss_mask[i, p : p + c] = True
        logprobs[i, p : p + c] = torch.tensor(generation.logprobs[i], dtype=torch.float32)
    return Trajectories(
        prompts=tuple(prompts[i // g] for i in range(b)),
        completions=generation.texts,
        input_ids=input_ids,
        attention_mask=attention_mask,
        loss_mask=loss_mask,
        generator_logprobs=logprobs,
        finish_reasons=generation.finish_reasons,
        group_size=g,
        policy_version=policy_version,
        rows=tuple(rows),
    )
