"""Who holds the memory when: the one owner of the hand-off between a colocated engine and the policy.

A generator that runs in this process shares the machine's memory with the policy. Each side declares what it
can let go of (the :class:`rlkit.generation.base.Generator` and :class:`rlkit.policy.base.Policy` protocols);
:class:`Handoff` reads those declarations once, when the pair is built, and is the only code that acts on them,
so the run's stages never branch on an engine or a backend. NeMo-RL's colocated weight synchronizer owns the same
job. The engine's side is one of:

    sleep            vLLM in this process on a GPU sleeps between rollouts. At each refit the policy's optimizer
                     state goes to host memory first (NeMo-RL's ``offload_before_refit``), so the engine has that
                     memory while it wakes, loads and generates; the policy brings the state back at its next step.
    release_weights  the CPU's stand-in for sleep (``policy.generation.vllm_cfg.release_weights_for_training``): the
                     engine frees its weights before the policy's passes (logprobs, train) and the refit rebuilds
                     them; in turn the policy frees its gradient buffers at the refit (its optimizer state has
                     nowhere to go). A rollout asked for while the weights are out needs a refit first.
    none             an engine in another process (a Ray actor), or one that keeps its memory: nothing moves.

Independent of the engine, with adapters and ``policy.lora_cfg.release_base_while_generating`` the policy's
frozen base is out while the engine generates: released before the engine first loads and before each refit's
export, which reads it back a layer at a time beside the engine's reload; the next forward pass reads it back.
"""

from __future__ import annotations

from rlkit.config.engines import EngineHandoff
from rlkit.generation.base import Generator
from rlkit.policy.base import Policy


def engine_handoff(generator: Generator) -> EngineHandoff:
    """What the engine's side of the hand-off is, from what the generator declares (which it took from
    :func:`rlkit.config.engines.engine_handoff`, the decision the memory plan reads too)."""
    if generator.sleeps_between_rollouts:
        return "sleep"
    return "release_weights" if generator.releases_weights_for_training else "none"


def before_engine_starts(policy: Policy) -> None:
    """Once, between building the policy and the engine: a frozen base that is out while the engine generates
    leaves before the engine loads, so the two are never both resident."""
    if policy.releases_base_while_generating:
        policy.release_frozen_base()


class Handoff:
    """The memory hand-off of one policy and one generator; see the module docstring for the strategies."""

    def __init__(self, policy: Policy, generator: Generator):
        self.policy, self.generator = policy, generator
        self.engine: EngineHandoff = engine_handoff(generator)
        self.frozen_base_out_while_generating = policy.releases_base_while_generating

    def engine_needs_refit(self) -> bool:
        """Before a rollout: whether the engine holds no weights (it released them for a policy pass, and no refit
        has rebuilt them since), so that a refit must come first."""
        return self.engine == "release_weights" and self.generator.weights_released

    def before_policy_pass(self) -> bool:
        """Before the policy's logprobs or train pass: the engine lets go of its weights where it does so. Returns
        whether it did just now (the engine then holds no policy version until the next refit)."""
        if self.engine != "release_weights" or self.generator.weights_released:
            return False
        self.generator.release_weights()
        return True

    def before_refit(self) -> None:
        """Before the weights go to the engine: the policy lets go of what the engine will use while it loads and
        generates."""
        if self.engine == "sleep":
            self.policy.offload_optimizer_state()
        elif self.engine == "release_weights":
            self.policy.release_gradient_buffers()
        if self.frozen_base_out_while_generating:
            self.policy.release_frozen_base()  # the export reads it back a layer at a time, and leaves it released

    def __repr__(self) -> str:
        base = ", frozen base out while generating" if self.frozen_base_out_while_generating else ""
        return f"Handoff(engine: {self.engine}{base})"
