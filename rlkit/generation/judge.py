"""A judge made of an engine: the batch function :class:`rlkit.envs.judge.JudgeEnvironment` calls.

``engine_judge(generator, tokenizer)`` renders each judge prompt as a user turn with the tokenizer's chat template
and samples one reply per prompt in a single engine call (greedy by default). The engine is the policy's own
(``session.generator``: the judge is the current policy, and moves with it) or a second model folder's, e.g.
``engine_judge(VllmGenerator(folder, GenerationConfig(), max_model_len=512), AutoTokenizer.from_pretrained(folder))``.

Deliberate simplifications: one vLLM engine per process is the norm here, so a second engine in the training
process is for small judges on a GPU with room; a large judge belongs behind an API (any ``list[str] ->
list[str]`` function is a judge).
"""

from __future__ import annotations

from typing import Any, Callable, Mapping, Optional

from rlkit.data.chat import render_prompts
from rlkit.generation.base import Generator, SamplingSettings


def engine_judge(generator: Generator, tokenizer: Any, max_new_tokens: int = 16, temperature: float = 0.0,
                 seed: int = 0, system_prompt: Optional[str] = None,
                 template_kwargs: Optional[Mapping[str, Any]] = None) -> Callable[[list[str]], list[str]]:
    """``judge(prompts) -> replies``: one reply per prompt from ``generator`` (greedy unless ``temperature``)."""
    sampling = SamplingSettings(temperature=temperature, max_new_tokens=max_new_tokens, seed=seed)

    def judge(prompts: list[str]) -> list[str]:
        ids = render_prompts(tokenizer, list(prompts), system_prompt, template_kwargs=template_kwargs)
        return list(generator.generate(ids, 1, sampling).texts)

    return judge
