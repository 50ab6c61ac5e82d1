"""The mutable state of one run, in one object: what ``Session(config)`` starts, ``reset()`` replaces and a
checkpoint saves.

Why one object: a field added here is started, reset and checkpointed by the same three methods
(:meth:`RunState.fresh`, :meth:`RunState.state_dict`, :meth:`RunState.load_state_dict`), instead of being
copied by hand in the session's constructor, its reset and the checkpoint code.

Deliberate simplifications: the current batch and the latest results (``batch``, ``last_*``) are not
saved, a resumed run re-draws the step's rollout from the kept prompt rows (same seed, same weights, same
rollout); the policy's own state (weights, optimizer, version) lives with the policy.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any, Optional

from rlkit.algorithms import RunningBaseline
from rlkit.data import PromptSampler
from rlkit.run.history import RolloutHistory
from rlkit.run.metrics import StepMetrics
from rlkit.stages.sft import WarmStart
from rlkit.trajectories import Trajectories


@dataclass
class RunState:
    """Step counter, history, prompt position, running baseline, the step's prompts and the latest results."""

    sampler: PromptSampler  # the next prompts; its position is the run's position in the data
    step: int = 0  # RL steps completed
    history: list[StepMetrics] = field(default_factory=list)  # one entry per completed step
    baseline: RunningBaseline = field(default_factory=RunningBaseline)  # reinforce_baseline's reward EMA
    step_rows: list[dict] = field(default_factory=list)  # prompt rows drawn for the current step, in order
    batch: Optional[Trajectories] = None  # the latest batch a stage returned
    last_train: Any = None
    last_refit: Any = None
    last_eval: Any = None
    last_sft: Any = None
    last_dpo: Any = None
    warm_start: Optional[WarmStart] = None  # what the next sft() continues (not saved: a resumed run starts anew)
    preference: Optional[WarmStart] = None  # what the next dpo() continues (its pairs, optimizer; not saved)
    stop_requested: bool = False  # run() ends after the current step
    store: RolloutHistory = field(default_factory=RolloutHistory)  # past batches and weights (not saved)

    @classmethod
    def fresh(cls, config: Any, dataset: Any) -> "RunState":
        """The state ``Session(config)`` starts in: step 0, the sampler at the start of the seed's order."""
        return cls(PromptSampler(dataset["train"], config.grpo.num_prompts_per_step, seed=config.seed))

    def rows_for_step(self, n: int) -> list[dict]:
        """The first ``n`` of the step's prompt rows, drawn from the sampler the first time they are asked for.

        The rows stay the step's until it ends, so a repeated rollout uses the same prompts; a source that
        needs more rows than were drawn (dynamic sampling after a plain rollout, a larger
        ``grpo.num_prompts_per_step``) draws only the missing ones."""
        if len(self.step_rows) < n:
            self.step_rows = self.step_rows + self.sampler.next_batch(n - len(self.step_rows))
        return self.step_rows[:n]

    def end_step(self, metrics: StepMetrics) -> None:
        """Record a completed step; the next one draws new prompts."""
        self.step += 1
        self.step_rows = []
        self.history.append(metrics)

    def state_dict(self) -> dict[str, Any]:
        """JSON-able: everything but the current batch and the latest results."""
        return {"step": self.step, "sampler": self.sampler.state_dict(), "step_rows": self.step_rows,
                "baseline": dataclasses.asdict(self.baseline),
                "history": [{"step": m.step, "policy_version": m.policy_version, "values": m.values}
                            for m in self.history]}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Continue from ``state_dict()``'s output; the batch and the latest results are cleared."""
        self.sampler.load_state_dict(state["sampler"])
        self.step, self.step_rows = state["step"], list(state["step_rows"])
        self.baseline = RunningBaseline(**state["baseline"])
        self.history = [StepMetrics(m["step"], m["policy_version"], m["values"]) for m in state["history"]]
        self.batch = self.last_train = self.last_refit = self.last_eval = self.last_sft = self.last_dpo = None
        self.stop_requested = False
