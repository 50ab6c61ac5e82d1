"""Sliding-window attention for every family that has it: Megatron's ``window_size`` / ``window_attn_skip_freq`` from
an :class:`rlkit.policy.architecture.Architecture`'s ``sliding_window`` and ``local_layers``.

Which families, and which layers:

- Gemma 3: its ``layer_types`` name the local (``sliding_attention``) layers; the global ones see the whole sequence;
- Mistral and Phi-3 (Phi-3-mini-4k's ``sliding_window: 2047`` within 4096 positions): transformers applies their
  ``sliding_window`` in every layer whenever it is set, so every layer is local;
- GPT-OSS: its ``layer_types`` alternate sliding and full layers, as Gemma 3's.

The rule is transformers' (``masking_utils.sliding_window_overlay``): query ``q`` sees key ``k`` where
``0 <= q - k < sliding_window``, the token itself included; Megatron's ``window_size = (left, right)`` counts the keys
before and after the query, so ``(sliding_window - 1, 0)``. The mask itself is Megatron's
(``fused_softmax.get_sliding_window_causal_mask``, made on the CPU by :mod:`.cpu`'s stand-in where there is no CUDA),
which Megatron's unfused attention applies in a local layer in place of the causal mask, and which
:class:`.attention.SDPAttention` passes to SDPA on CUDA. A KV-cached decode (the policy's own generator) gets the mask
of its ``sq`` new queries over ``skv`` cached keys from the same helper; packed rows run attention segment by segment
(:mod:`.attention`), so each row's window is its own.

Deliberate simplification: the ordinary rows' layout only for the prompt-sharing forward (``share_prompts`` is skipped
with a window: its shared sequence's mask is not the window's; see ``MegatronPolicy.shared_prompt_scores``).
"""

from __future__ import annotations


def window_settings(arch) -> dict:
    """Megatron's window options for ``arch``: a local layer's query attends to itself and ``sliding_window - 1``
    positions before it, a global layer to every earlier position; {} where no layer is local."""
    if not arch.sliding_window or not arch.local_layers or not any(arch.local_layers):
        return {}
    return dict(window_size=(arch.sliding_window - 1, 0), window_attn_skip_freq=list(arch.local_layers))
