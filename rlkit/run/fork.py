"""``a, b = session.fork(2)``: in-memory branches of one session that share its engines, data and environment
but each own their weights (the adapters only, with adapters on), optimizer and schedule state, run state (step,
history, sampler position, baseline), config and loss, and RNG.

How: one branch at a time is *active*, its state live in the session; the others are *parked* as copies
(:class:`Parked`). Using a branch (``a.step()``, ``a.run(30)``, ``a.configure([...])``, ``a.evaluate()``, any
session attribute through it) first activates it: the active branch is parked (its state copied out), the branch's
state copied in, and the generator marked stale, so the next step or evaluation refits it with the branch's
weights (one vLLM engine serves every branch). ``swap_seconds`` records what each activation cost (the refit
is on the step's clock, under ``timing/refit``). The session's own state before the first fork is the branch
``"main"``; ``session.branches`` lists all of them, the active one marked.

Exactness: activation copies tensors and RNG states bit for bit, so branches stepped alternately give the same
metrics as the same branches run one after the other (tests/run/test_what_if.py).

Deliberate simplifications: async GRPO is refused (its producer samples ahead with the active weights); a new
branch starts with an empty rollout history (``session.store``) and no latest batch; the KL reference and the
records (``log_to``) are shared by every branch; a parked branch costs one copy of the trainable weights and the
optimizer moments (``Branch.nbytes``).
"""

from __future__ import annotations

import copy
import string
import time
from dataclasses import dataclass, field
from typing import Any, Optional

import pandas as pd

from rlkit import rng
from rlkit.policy.snapshots import PolicyState, capture_state, load_state
from rlkit.run.sources import RolloutSource, rollout_source
from rlkit.run.state import RunState


@dataclass
class Parked:
    """A branch's state while another branch is active."""

    policy: PolicyState
    run_state: RunState
    rollouts: RolloutSource
    config: Any  # RunConfig
    loss_fn: Any
    rng: tuple  # rlkit.rng.capture()

    @property
    def nbytes(self) -> int:
        return self.policy.nbytes


def park(session: Any) -> Parked:
    """A copy of the session's branch state (the session keeps running on its own)."""
    return Parked(capture_state(session.policy), session.run_state, session.rollouts, session.config,
                  session.loss_fn, rng.capture())


def enter(session: Any, parked: Parked) -> None:
    """Make ``parked`` the session's state; the generator is stale until the next refit."""
    load_state(session.policy, parked.policy)
    session.run_state, session.rollouts = parked.run_state, parked.rollouts
    session.config, session.loss_fn = parked.config, parked.loss_fn
    rng.restore(*parked.rng)
    session.generator_version = -1  # the engine holds the previous branch's weights


def _copy(session: Any, parked: Parked) -> Parked:
    """An independent copy of ``parked`` for a new branch: its own weights, optimizer state, run state and source."""
    run = RunState.fresh(parked.config, session.dataset)
    run.load_state_dict(parked.run_state.state_dict())
    source = rollout_source(parked.config, session._sample, session._score, run, -1,
                            lambda: session.config.updates_per_step)
    p = parked.policy
    policy = PolicyState({k: v.clone() for k, v in p.weights.items()}, copy.deepcopy(p.optimizer),
                         copy.deepcopy(p.scheduler), p.version)
    return Parked(policy, run, source, parked.config, parked.loss_fn, parked.rng)


@dataclass
class Forks:
    """The branches of one session and which one is active."""

    session: Any
    branches: dict[str, "Branch"] = field(default_factory=dict)
    active: Optional["Branch"] = None


class Branch:
    """One branch of a forked session; every session method and attribute is reached through it
    (``a.step()``, ``a.history``, ``a.save(path)``), which activates it first."""

    def __init__(self, name: str, forks: Forks, parked: Optional[Parked]):
        self.name, self._forks, self._parked = name, forks, parked
        self.swap_seconds: list[float] = []  # what each activation of this branch cost (park the other + enter)
        self._parked_bytes = parked.nbytes if parked is not None else 0

    @property
    def active(self) -> bool:
        return self._forks.active is self

    @property
    def nbytes(self) -> int:
        """Bytes a parked copy of this branch holds (trainable weights and optimizer moments)."""
        return self._parked.nbytes if self._parked is not None else self._parked_bytes

    def activate(self) -> "Branch":
        """Make this branch's state the session's (nothing to do when it is active already)."""
        forks = self._forks
        if self.name not in forks.branches:
            raise KeyError(f"branch {self.name!r} was dropped")
        if forks.active is self:
            return self
        t0 = time.perf_counter()
        session = forks.session
        session._refuse_if_closed("fork")
        with session.rollouts.exclusive():
            previous = forks.active
            previous._parked = park(session)
            previous._parked_bytes = previous._parked.nbytes
            enter(session, self._parked)
            self._parked, forks.active = None, self
        self.swap_seconds.append(time.perf_counter() - t0)
        return self

    def drop(self) -> None:
        """Forget this branch (its memory is freed); the active branch cannot be dropped."""
        if self.active:
            raise ValueError(f"branch {self.name!r} is active: activate another one first "
                             f"(session.branches[name].activate())")
        self._forks.branches.pop(self.name, None)
        self._parked = None

    def __getattr__(self, name: str) -> Any:
        if name.startswith("_"):
            raise AttributeError(name)
        self.activate()
        return getattr(self._forks.session, name)

    def __repr__(self) -> str:
        state = "active" if self.active else f"parked, {self.nbytes / 2**20:.1f} MiB"
        step = (self._forks.session.step_count if self.active else
                self._parked.run_state.step if self._parked is not None else "?")
        return f"Branch({self.name!r}, step {step}, {state})"


def forks_of(session: Any) -> Forks:
    """The session's branches, the session's own state becoming branch ``"main"`` on first use."""
    forks = getattr(session, "_forks", None)
    if forks is None:
        forks = session._forks = Forks(session)
        main = Branch("main", forks, None)
        forks.branches["main"], forks.active = main, main
    return forks


def fork(session: Any, n: Optional[int] = None) -> Any:
    """``n`` new branches (one Branch for ``n=None``, else a list) from the active branch's state now; the active
    branch stays active."""
    session._refuse_if_closed("fork")
    if session.config.grpo.async_grpo.enabled:
        raise NotImplementedError("fork() with async GRPO: its producer samples ahead with the active weights; "
                                  "fork a session with grpo.async_grpo.enabled=false")
    forks = forks_of(session)
    with session.rollouts.exclusive():
        now = park(session)
    made = []
    for _ in range(1 if n is None else n):
        name = next(c for c in list(string.ascii_lowercase) + [f"branch{i}" for i in range(10**6)]
                    if c not in forks.branches)
        made.append(forks.branches.setdefault(name, Branch(name, forks, _copy(session, now))))
    return made[0] if n is None else made


def compare_branches(session: Any, num_prompts: Optional[int] = None, greedy: Optional[bool] = None) -> Any:
    """Held-out accuracy of every branch (``session.evaluate`` on each, the same prompts), as a DataFrame with
    the branch's step and policy version; the branch active before stays active."""
    forks = forks_of(session)
    was = forks.active
    rows = []
    try:
        for name, branch in list(forks.branches.items()):
            branch.activate()
            result = session.evaluate(num_prompts, greedy)
            rows.append({"branch": name, "step": session.step_count, "policy_version": session.policy.version,
                         "accuracy": result.accuracy})
    finally:
        was.activate()
    return pd.DataFrame(rows).set_index("branch")
