"""Prompts rendered as chat turns by the tokenizer's chat template: the one way rlkit turns a prompt into the
text and token ids the engine and the trainer see.

``template_kwargs`` are passed to every ``apply_chat_template`` call (``data.chat_template_kwargs``, e.g.
``{"enable_thinking": False}`` for Qwen3's template, which otherwise opens a thinking block); ``tools`` are the
JSON tool declarations a native-tool environment renders (``apply_chat_template(..., tools=)``).
"""

from __future__ import annotations

from typing import Any, Mapping, Optional, Sequence

from rlkit.errors import ModelError


def apply_template(tokenizer: Any, messages: list[dict[str, Any]], add_generation_prompt: bool,
                   tools: Optional[Sequence[dict[str, Any]]] = None,
                   template_kwargs: Optional[Mapping[str, Any]] = None) -> str:
    """``messages`` rendered as text by the tokenizer's chat template, with ``tools`` and ``template_kwargs``."""
    return tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=add_generation_prompt,
                                         tools=list(tools) if tools else None, **dict(template_kwargs or {}))


def render_prompt_texts(tokenizer: Any, prompts: list[str], system_prompt: Optional[str] = None,
                        tools: Optional[Sequence[dict[str, Any]]] = None,
                        template_kwargs: Optional[Mapping[str, Any]] = None) -> list[str]:
    """Each prompt as a user turn (after an optional system turn) rendered by the chat template."""
    if not getattr(tokenizer, "chat_template", None):
        raise ModelError(f"the tokenizer {type(tokenizer).__name__} has no chat template, so prompts cannot be "
                         "rendered as chat turns; set tokenizer.chat_template to a Jinja template, or use a model "
                         "folder made by `rlkit make-model` (its tokenizer ships one)")
    head = [{"role": "system", "content": system_prompt}] if system_prompt is not None else []
    return [apply_template(tokenizer, head + [{"role": "user", "content": p}], True, tools, template_kwargs)
            for p in prompts]


def render_prompts(tokenizer: Any, prompts: list[str], system_prompt: Optional[str] = None,
                   tools: Optional[Sequence[dict[str, Any]]] = None,
                   template_kwargs: Optional[Mapping[str, Any]] = None) -> list[list[int]]:
    """Token ids of each rendered prompt, ending with the assistant header so generation starts the reply.

    The template already writes any BOS, so the text is encoded with ``add_special_tokens=False``.
    """
    texts = render_prompt_texts(tokenizer, prompts, system_prompt, tools, template_kwargs)
    return [list(ids) for ids in tokenizer(texts, add_special_tokens=False)["input_ids"]]


def appended_message_ids(tokenizer: Any, messages: list[dict[str, Any]], new_messages: list[dict[str, Any]],
                         last_id: int, tools: Optional[Sequence[dict[str, Any]]] = None,
                         template_kwargs: Optional[Mapping[str, Any]] = None) -> list[int]:
    """The ids that follow a conversation whose last message is the assistant's turn (its last sampled id
    ``last_id``): the turn's EOS if it was cut, what the template writes after the EOS (ChatML's newline), then
    ``new_messages`` rendered by the chat template (all at once: a template may join consecutive tool messages
    into one turn) and the header of the next assistant turn. The conversation's own ids are never re-tokenized."""
    before = apply_template(tokenizer, messages, False, tools, template_kwargs)
    after = apply_template(tokenizer, messages + new_messages, True, tools, template_kwargs)
    if not after.startswith(before):
        raise ValueError("the chat template renders a conversation differently once a message is appended, so the "
                         "new message cannot be appended as tokens; use a template that only appends")
    eos = tokenizer.eos_token
    end = before.rfind(eos) if eos else -1
    tail = before[end + len(eos):] if end >= 0 else ""
    closing = [] if last_id == tokenizer.eos_token_id else [tokenizer.eos_token_id]
    return closing + tokenizer(tail + after[len(before):], add_special_tokens=False)["input_ids"]
