"""Generation on the policy's own Megatron-Core model (``policy.generation.backend: megatron``): no second copy of
the weights, so a refit is a version bump.

How it samples: Megatron-Core's static inference context (:class:`megatron.core.inference.contexts.
StaticInferenceContext`) holds the KV cache, and the policy's ``GPTModel`` runs with it, the way Megatron's static
engine drives it: the prompts are right-aligned at position 0, the shortest prompt's tokens are prefilled at once,
then one position at a time for every row, where a row still inside its prompt takes its prompt's token and a row
past it samples. So no row ever attends to padding, and no attention mask is needed. Megatron's own text generation
controller asks CUDA for its buffers (``torch.cuda.current_device()`` tensors, pinned memory) and cannot run on the
CPU; this loop is the CPU's stand-in for it, on the same model, context and KV cache.

Sampling is rlkit's (the :class:`rlkit.generation.base.Generator` contract): the logits at the generator's
temperature, then top-k and top-p (truncated and renormalised); the logprob of each sampled token is taken under that
processed distribution (vLLM's ``processed_logprobs``). Each sample has its own random stream, seeded as vLLM seeds
its requests' children (:func:`rlkit.generation.base.request_seed`), so a sample does not depend on its batch-mates.
A sample ends at an EOS id (the tokenizer's and ``generation_config.json``'s, as vLLM reads them), at a stop string,
or after ``max_new_tokens``.

With ``policy.precision=bfloat16`` it samples from the bf16 compute copy the policy's passes use; with adapters on,
from the adapted model. One process, one model-parallel rank (validation refuses tensor or pipeline parallelism and
Ray workers for this engine for now).

Memory: Megatron's static context computes the logits of the last position only, prefill included
(``materialize_only_last_token_logits``), so no [B, prompt, V] tensor is made. On the CPU a call leaves its KV cache
and its many small per-step tensors as free pages inside glibc's heap, which stay resident and grow the process
between stages (at the Qwen3-0.6B shape, 2 x 4 x 128 tokens: +400 MB a rollout); they go back to the system when it
returns (``malloc_trim``, :func:`rlkit.host_memory.release_freed_heap_pages`), and what the train step before left
free goes back when it starts, so that the KV cache is not added on top of it.
"""

from __future__ import annotations

from typing import Any, Iterable

import torch
from torch import Tensor

from rlkit.config.components import GenerationConfig
from rlkit.generation.base import Generation, KeepsItsMemory, SamplingSettings, request_seed
from rlkit.host_memory import release_freed_heap_pages


class MegatronGenerator(KeepsItsMemory):
    """Samples from ``model`` (a :class:`rlkit.policy.megatron.policy.MegatronAdapter`) with its own weights."""

    def __init__(self, model: Any, cfg: GenerationConfig, max_model_len: int, seed: int = 0):
        from transformers import AutoTokenizer, GenerationConfig as HFGenerationConfig

        self.model, self.cfg, self.max_model_len, self.seed = model, cfg, max_model_len, seed
        folder = model.cfg.model_name
        self.tokenizer = AutoTokenizer.from_pretrained(folder)
        try:
            listed = HFGenerationConfig.from_pretrained(folder).eos_token_id
        except OSError:  # no generation_config.json: the tokenizer's EOS alone
            listed = None
        listed = [listed] if isinstance(listed, int) else list(listed or [])
        self.eos_token_ids = frozenset(i for i in [self.tokenizer.eos_token_id, *listed] if i is not None)

    @torch.no_grad()
    def generate(self, prompt_token_ids: list[list[int]], n: int, sampling: SamplingSettings) -> Generation:
        release_freed_heap_pages()  # what the stages before left free (the train step's), under this call's peak
        rows = [list(p) for p in prompt_token_ids for _ in range(n)]
        seed = self.seed if sampling.seed is None else sampling.seed
        streams = [torch.Generator(device=self.model.device).manual_seed(request_seed(seed, i, n) + j)
                   for i in range(len(prompt_token_ids)) for j in range(n)]
        lengths = [len(r) for r in rows]
        total = min(max(lengths) + sampling.max_new_tokens, self.max_model_len)
        if min(lengths) < 1 or max(lengths) >= total:
            raise ValueError(f"prompts of {min(lengths)}..{max(lengths)} tokens leave no room to generate within "
                             f"max_model_len={self.max_model_len}")
        tokens = torch.zeros(len(rows), total, dtype=torch.long)
        for r, ids in enumerate(rows):
            tokens[r, :len(ids)] = torch.tensor(ids)
        sampled: list[list[int]] = [[] for _ in rows]
        logprobs: list[list[float]] = [[] for _ in rows]
        finish: list[str | None] = [None] * len(rows)
        context = self.model.inference_context(len(rows), total)
        start = min(lengths)
        logits = self.model.inference_logits(tokens[:, :start], 0, context)  # prefill: [B, V] at position start - 1
        for position in range(start, total):
            processed = _processed_logprobs(logits, sampling)  # [B, V], one pass for every row
            for r in range(len(rows)):
                if finish[r] is not None or position < lengths[r]:
                    continue  # done, or still inside its prompt (its own token is already in `tokens`)
                token, logprob = _sample(processed[r], sampling.temperature <= 0, streams[r])
                tokens[r, position] = token
                sampled[r].append(token)
                logprobs[r].append(logprob)
                finish[r] = self._finished(sampled[r], sampling)
            if all(f is not None for f in finish) or position + 1 == total:
                break
            logits = self.model.inference_logits(tokens[:, position:position + 1], position, context)
        del context, logits, processed  # the KV cache, then its freed pages back to the system (below)
        release_freed_heap_pages()
        samples = []
        for r in range(len(rows)):
            text = self.tokenizer.decode(sampled[r], skip_special_tokens=True)
            for stop in sampling.stop_strings:
                text = text.split(stop)[0]
            samples.append((sampled[r], logprobs[r], text, finish[r] or "length"))
        return Generation.from_samples(prompt_token_ids, samples, n)

    def _finished(self, sampled: list[int], sampling: SamplingSettings) -> str | None:
        """"stop" at an EOS id or a stop string, "length" at ``max_new_tokens``, else None (still sampling)."""
        if sampled[-1] in self.eos_token_ids:
            return "stop"
        if sampling.stop_strings:
            text = self.tokenizer.decode(sampled, skip_special_tokens=True)
            if any(stop in text for stop in sampling.stop_strings):
                return "stop"
        return "length" if len(sampled) >= sampling.max_new_tokens else None

    def update_weights(self, bucket: Iterable[tuple[str, Tensor]]) -> None:
        raise RuntimeError("the Megatron generator samples from the policy's own weights: nothing is loaded into it "
                           "(its refit is rlkit.weight_sync.SharedWeights)")

    def reset_prefix_cache(self) -> None:
        """No cache survives between calls to ``generate``."""

    def close(self) -> None:
        """The model is the policy's: the policy frees it."""

    def __repr__(self) -> str:
        return f"MegatronGenerator(the policy's own model, max_model_len={self.max_model_len})"


def _processed_logprobs(logits: Tensor, sampling: SamplingSettings) -> Tensor:
    """Logits [B, V] (fp32) -> the log-probabilities [B, V] each row samples from: the plain log-softmax at
    temperature 0 (greedy), else the logits at the temperature, truncated to the top k and then to the smallest set
    of the most likely tokens whose probability reaches top_p, renormalised (vLLM's processed logprobs)."""
    if sampling.temperature <= 0:
        return torch.log_softmax(logits, -1)
    scaled = logits / sampling.temperature
    if sampling.top_k:
        kth = torch.topk(scaled, min(sampling.top_k, scaled.shape[-1]), dim=-1).values[:, -1:]
        scaled = scaled.masked_fill(scaled < kth, float("-inf"))
    if sampling.top_p < 1.0:
        ordered, order = torch.sort(scaled, dim=-1, descending=True)
        probs = torch.softmax(ordered, -1)
        above = probs.cumsum(-1) - probs  # the mass of the more likely tokens
        scaled = scaled.scatter(-1, order, ordered.masked_fill(above >= sampling.top_p, float("-inf")))
    return torch.log_softmax(scaled, -1)


def _sample(logprobs: Tensor, greedy: bool, stream: torch.Generator) -> tuple[int, float]:
    """One token from a row's processed ``logprobs`` [V] (the most likely when ``greedy``) and its logprob."""
    token = int(logprobs.argmax()) if greedy else int(torch.multinomial(logprobs.exp(), 1, generator=stream))
    return token, float(logprobs[token])
