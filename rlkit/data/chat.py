"""Prompts rendered as chat turns by the tokenizer's chat template: the one way rlkit turns a prompt into the
text and token ids the engine and the trainer see."""

from __future__ import annotations

from typing import Any, Optional

from rlkit.errors import ModelError


def render_prompt_texts(tokenizer: Any, prompts: list[str], system_prompt: Optional[str] = None) -> list[str]:
    """Each prompt as a user turn (after an optional system turn) rendered by the chat template."""
    if not getattr(tokenizer, "chat_template", None):
        raise ModelError(
            f"the tokenizer {type(tokenizer).__name__} has no chat template, so prompts cannot be rendered as "
            "chat turns; set tokenizer.chat_template to a Jinja template, or use a model folder made by "
            "`rlkit make-model` (its tokenizer ships one)"
        )
    head = [{"role": "system", "content": system_prompt}] if system_prompt is not None else []
    return [
        tokenizer.apply_chat_template(
            head + [{"role": "user", "content": p}], tokenize=False, add_generation_prompt=True
        )
        for p in prompts
    ]


def render_prompts(tokenizer: Any, prompts: list[str], system_prompt: Optional[str] = None) -> list[list[int]]:
    """Token ids of each rendered prompt, ending with the assistant header so generation starts the reply.

    The template already writes any BOS, so the text is encoded with ``add_special_tokens=False``.
    """
    texts = render_prompt_texts(tokenizer, prompts, system_prompt)
    return [list(ids) for ids in tokenizer(texts, add_special_tokens=False)["input_ids"]]
