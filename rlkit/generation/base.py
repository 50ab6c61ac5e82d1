"""The Generator protocol: sample completions with their token ids and logprobs; take new weights.

Logprob convention: every backend reports the logprob of each sampled token under the distribution it
sampled from after temperature (vLLM's ``processed_logprobs``), which is what the trainer computes with
its logits divided by the same temperature. With ``top_p < 1`` or ``top_k`` the generator's distribution is
truncated and renormalised while the trainer's is not; the mismatch metric shows the difference.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from typing import Iterable, Optional, Protocol, runtime_checkable

from torch import Tensor


@dataclass(frozen=True)
class SamplingSettings:
    """How a generator samples one call's completions (``Session.sampling()`` builds them from the config)."""

    temperature: float = 1.0
    top_p: float = 1.0
    top_k: Optional[int] = None
    max_new_tokens: int = 16
    stop_strings: tuple[str, ...] = ()
    seed: Optional[int] = None  # per-call seed: the same seed and prompts give the same samples


@dataclass(frozen=True)
class Generation:
    """``B = N * G`` samples, the ``G`` samples of prompt ``i`` at rows ``i*G .. i*G+G-1``."""

    prompt_token_ids: tuple[tuple[int, ...], ...]  # [N] ragged
    token_ids: tuple[tuple[int, ...], ...]  # [B] ragged, sampled tokens (EOS included when sampled)
    logprobs: tuple[tuple[float, ...], ...]  # [B] ragged, aligned with token_ids
    texts: Optional[tuple[str, ...]]  # [B] decoded completion, stop string excluded; None: not decoded yet
    finish_reasons: tuple[str, ...]  # [B] "stop" | "length"
    group_size: int  # G

    @classmethod
    def from_samples(cls, prompt_token_ids, samples, group_size: int) -> "Generation":
        """From ``samples``: (token_ids, logprobs, text, finish_reason) per sample, prompt-major."""
        ids, lps, texts, reasons = zip(*samples) if samples else ((), (), (), ())
        return cls(
            prompt_token_ids=tuple(tuple(p) for p in prompt_token_ids),
            token_ids=tuple(tuple(x) for x in ids),
            logprobs=tuple(tuple(x) for x in lps),
            texts=tuple(texts),
            finish_reasons=tuple(reasons),
            group_size=group_size,
        )


@runtime_checkable
class Generator(Protocol):
    """Sampling and weight loading only: how weights reach an engine in another process is a weight sync's
    business (:mod:`rlkit.weight_sync`), built together with its generator by :mod:`rlkit.builders`."""

    # what the engine lets go of for a colocated policy (:class:`rlkit.weight_sync.handoff.Handoff` acts on it)
    sleeps_between_rollouts: bool  # asleep between rollouts (vLLM in this process on a GPU)
    releases_weights_for_training: bool  # frees its weights for the policy's passes (the CPU's stand-in for sleep)
    weights_released: bool  # its weights are out now: a refit must rebuild them before the next rollout

    def release_weights(self) -> int:
        """Free the engine's weights until the next refit (where ``releases_weights_for_training``); the bytes freed."""
        ...

    def generate(self, prompt_token_ids: list[list[int]], n: int, sampling: SamplingSettings) -> Generation:
        """``n`` samples for each prompt (token ids, chat template already applied), their texts decoded."""
        ...

    def update_weights(self, bucket: Iterable[tuple[str, Tensor]]) -> None:
        """Load HF-named tensors: a colocated refit's whole stream, or one bucket of a broadcast refit; either way
        fused groups (q, k, v together; gate, up together) arrive whole."""
        ...

    def reset_prefix_cache(self) -> None:
        """Drop cached prefix KV: required after new weights, or later samples use stale attention state."""
        ...

    def close(self) -> None: ...


class KeepsItsMemory:
    """The hand-off declarations of an engine with nothing to let go of for a colocated policy (transformers'
    ``generate``, which holds no cache between calls; an engine in its own process)."""

    sleeps_between_rollouts = False
    releases_weights_for_training = False
    weights_released = False

    def release_weights(self) -> int:
        return 0


def request_seed(seed: int, prompt_index: int, n: int) -> int:
    """The seed of prompt ``prompt_index``'s ``n``-sample request in a call seeded ``seed``.

    Sample ``j`` of a request samples with ``seed + j`` (vLLM's children; the Megatron generator's likewise), so
    requests seeded ``seed + i`` would share streams across prompts: sample (i, j) and sample (i + 1, j - 1) would
    draw the same random numbers. Each request gets its own block of 2**16 seeds instead, placed by a hash of (call seed, prompt index): distinct streams
    for every (prompt, sample), for every step, dynamic-sampling round and turn (their call seeds differ), and
    reproducible from the call's seed. Two blocks coincide with probability ~2**-47 per pair of requests."""
    if not 0 < n <= 1 << 16:
        raise ValueError(f"n={n} samples per prompt: rlkit's seeds hold 1 to 65536")
    digest = hashlib.blake2b(f"{seed}/{prompt_index}".encode(), digest_size=8).digest()
    return (int.from_bytes(digest, "big") >> 17) << 16  # 47 hash bits, then room for the children: < 2**63
