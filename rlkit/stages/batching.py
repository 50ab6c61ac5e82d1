"""Turn generator output (ragged token lists) into the padded :class:`Trajectories` batch."""

from __future__ import annotations

from typing import Any, Sequence

import torch

from rlkit.generation.base import Generation
from rlkit.trajectories import Trajectories


def trajectories_from_generation(generation: Generation, pad_token_id: int, prompts: Sequence[str],
                                 rows: Sequence[dict[str, Any]] = (), policy_version: int = 0,
                                 tokenizer: Any = None) -> Trajectories:
    """Right-pad prompt + completion of each sample to ``[B, T]`` and place the generator's logprobs on the
    completion tokens. ``prompts`` are the ``N`` rendered prompt texts; sample ``i`` belongs to prompt
    ``i // G``. ``tokenizer`` (the one that made the ids) travels with the batch for its token views."""
    if generation.texts is None:
        raise ValueError("the generation's completions are not decoded (texts=None, as VllmGenerator.sample "
                         "returns them): decode them first with rlkit.generation.vllm.decode_completions(generation, "
                         "tokenizer), or sample with Generator.generate, which decodes")
    g = generation.group_size
    b = len(generation.token_ids)
    prompt_lens = [len(generation.prompt_token_ids[i // g]) for i in range(b)]
    ends = [p + len(c) for p, c in zip(prompt_lens, generation.token_ids)]
    t = max(ends)
    # each field built once from padded Python rows (cheaper than a tensor write per sample)
    input_ids = torch.tensor([[*generation.prompt_token_ids[i // g], *generation.token_ids[i]]
                              + [pad_token_id] * (t - ends[i]) for i in range(b)], dtype=torch.long)
    logprobs = torch.tensor([[0.0] * prompt_lens[i] + list(generation.logprobs[i]) + [0.0] * (t - ends[i])
                             for i in range(b)], dtype=torch.float32)
    positions = torch.arange(t)
    attention_mask = positions < torch.tensor(ends).unsqueeze(1)
    loss_mask = attention_mask & (positions >= torch.tensor(prompt_lens).unsqueeze(1))
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
        tokenizer=tokenizer,
    )
