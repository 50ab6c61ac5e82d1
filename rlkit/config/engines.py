"""The generation engines as config knows them: what validation, the memory plan and the start line need of each
``policy.generation.backend``, without importing the engine (:mod:`rlkit.generation.engines` builds it).

Why a record per engine: each fact is read where it matters (a check, a plan part, a word on the start line), so a
new engine is one line here and one in :mod:`rlkit.generation.engines`, and no module branches on an engine's name.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

BYTES_PER_PARAMETER = {"float32": 4, "bfloat16": 2, "fp8": 1}  # an engine's weights by its precision


@dataclass(frozen=True)
class GenerationEngine:
    name: str  # its policy.generation.backend
    words: str  # on the start line
    # reads policy.generation.vllm_cfg (precision, KV cache, memory share); otherwise it samples in float32 and holds
    # nothing between calls
    reads_vllm_cfg: bool
    # can run in its own Ray actor, refit by broadcast (policy.generation.colocated.enabled=false); unset, async GRPO
    # puts it there
    runs_separately: bool
    # copies of the output head's table beside its weights on the CPU (vLLM: the prepacked kernel, and while it
    # loads the input embedding's, which rlkit drops after each load: rlkit.generation.vllm_cpu_kernels)
    cpu_head_copies: int
    # its CPU attention kernels take a few head sizes only (rlkit.models.factory.check_head_dim)
    cpu_head_dims_limited: bool
    # can let go of its memory for a colocated policy: sleep where its platform can, else release its weights
    # (rlkit.weight_sync.handoff)
    hands_off_memory: bool
    # samples from the policy's own model in this process (no copy of the weights: a refit is a version bump); the
    # training backend must offer it (BackendSection.generates_on_own_weights)
    on_policy_weights: bool = False

    def precision(self, vllm_cfg) -> str:
        """The precision of its own copy of the weights (an engine on the policy's own weights holds none: the memory
        plan counts nothing for it, and it samples at ``policy.precision``)."""
        return vllm_cfg.precision if self.reads_vllm_cfg else "float32"


ENGINES = {e.name: e for e in (
    GenerationEngine("vllm", "vLLM", reads_vllm_cfg=True, runs_separately=True, cpu_head_copies=2,
                     cpu_head_dims_limited=True, hands_off_memory=True),
    GenerationEngine("hf", "transformers generate", reads_vllm_cfg=False, runs_separately=False, cpu_head_copies=0,
                     cpu_head_dims_limited=False, hands_off_memory=False),
    GenerationEngine("megatron", "Megatron-Core, on the policy's own weights", reads_vllm_cfg=False,
                     runs_separately=False, cpu_head_copies=0, cpu_head_dims_limited=False, hands_off_memory=False,
                     on_policy_weights=True),
)}


EngineHandoff = Literal["sleep", "release_weights", "none"]  # what an engine lets go of for a colocated policy


def engine_handoff(generation, colocated: bool, on_cpu: bool, can_sleep: bool) -> EngineHandoff:
    """The engine's side of the memory hand-off (:mod:`rlkit.weight_sync.handoff`) for ``policy.generation``
    (``generation``): one decision, which the engine takes when it starts (its declared flags) and the memory plan
    takes to say what is resident when. An engine in its own process, or one that holds nothing between calls,
    keeps what it has ("none"); a colocated one sleeps where its platform can (``can_sleep``: vLLM on a GPU), and
    on the CPU releases its weights for the policy's passes when ``vllm_cfg.release_weights_for_training`` asks."""
    if not colocated or not generation.engine.hands_off_memory:
        return "none"
    if can_sleep:
        return "sleep"
    return "release_weights" if on_cpu and generation.vllm_cfg.release_weights_for_training else "none"

