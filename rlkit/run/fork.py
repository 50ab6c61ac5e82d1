"""``a, b = session.fork(2)``: in-memory branches of one session that share its engines, data and environment
but each own their weights (the adapters only, with adapters on), optimizer and schedule state, PPO's critic (its
weights and Adam state), run state (step, history, sampler position, baseline), config and loss, and RNG.

How: one branch at a time is *active*, its state live in the run (:class:`rlkit.run.run.Run`); the others are
*parked* as copies (:class:`Parked`). Using a branch (``a.step()``, ``a.run(30)``, ``a.configure([...])``,
``a.evaluate()``, any session attribute through it: a branch forwards to the facade that forked it, the Session)
first activates it: the active branch is parked (its state copied out), the branch's state copied in, and the
generator marked stale, so the next step or evaluation refits it with the branch's
weights (one vLLM engine serves every branch). ``swap_seconds`` records what each activation cost (the refit
is on the step's clock, under ``timing/refit``). The session's own state before the first fork is the branch
``"main"``; ``session.branches`` lists all of them, the active one marked.

Exactness: activation copies tensors and RNG states bit for bit, so branches stepped alternately give the same
metrics as the same branches run one after the other (tests/run/test_what_if.py).

Deliberate simplifications: async GRPO is refused (its producer samples ahead with the active weights); a new
branch starts with an empty rollout history (``session.store``) and no latest batch; the KL reference and the
records (``log_to``) are shared by every branch; a parked branch costs one copy of the trainable weights and the
optimizer moments, and of the critic with its moments under PPO (``Branch.nbytes``).
"""

from __future__ import annotations

import copy
import itertools
import string
import time
from dataclasses import dataclass, field
from typing import Any, Optional

import pandas as pd

from rlkit import rng
from rlkit.policy.critic import CriticState
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
    critic: Optional[CriticState] = None  # PPO's value model (critic.enabled)

    @property
    def nbytes(self) -> int:
        return self.policy.nbytes + (self.critic.nbytes if self.critic is not None else 0)


def park(run: Any) -> Parked:
    """A copy of the run's branch state (the run keeps going on its own)."""
    critic = run.components.critic.capture() if run.components.critic is not None else None
    return Parked(capture_state(run.policy), run.state, run.rollouts, run.config, run.loss_fn, rng.capture(), critic)


def enter(run: Any, parked: Parked) -> None:
    """Make ``parked`` the run's state; the generator is stale until the next refit."""
    load_state(run.policy, parked.policy)
    if parked.critic is not None:
        run.components.critic.restore(parked.critic)
    run.state, run.rollouts = parked.run_state, parked.rollouts
    run.config, run.loss_fn = parked.config, parked.loss_fn
    rng.restore(*parked.rng)
    run.generator_version = -1  # the engine holds the previous branch's weights


def _copy(run: Any, parked: Parked) -> Parked:
    """An independent copy of ``parked`` for a new branch: its own weights, optimizer state, run state and source."""
    state = RunState.fresh(parked.config, run.components.dataset)
    state.load_state_dict(parked.run_state.state_dict())
    source = rollout_source(parked.config, run.sample, run.score_fresh, state, -1, lambda: run.config.updates_per_step)
    p = parked.policy
    policy = PolicyState({k: v.clone() for k, v in p.weights.items()}, copy.deepcopy(p.optimizer),
                         copy.deepcopy(p.scheduler), p.version)
    critic = (CriticState({k: t.clone() for k, t in parked.critic.tensors.items()}, parked.critic.version)
              if parked.critic is not None else None)
    return Parked(policy, state, source, parked.config, parked.loss_fn, parked.rng, critic)


@dataclass
class Forks:
    """The branches of one run, which one is active, and the facade every branch forwards to."""

    run: Any  # rlkit.run.run.Run
    facade: Any  # what a branch's attributes are read from once it is active (the Session)
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
        """Make this branch's state the run's (nothing to do when it is active already)."""
        forks = self._forks
        if self.name not in forks.branches:
            raise KeyError(f"branch {self.name!r} was dropped")
        if forks.active is self:
            return self
        t0 = time.perf_counter()
        run = forks.run
        run.refuse_if_closed("fork")
        with run.rollouts.exclusive():
            previous = forks.active
            previous._parked = park(run)
            previous._parked_bytes = previous._parked.nbytes
            enter(run, self._parked)
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
        return getattr(self._forks.facade, name)

    def __repr__(self) -> str:
        state = "active" if self.active else f"parked, {self.nbytes / 2**20:.1f} MiB"
        step = (self._forks.run.state.step if self.active else
                self._parked.run_state.step if self._parked is not None else "?")
        return f"Branch({self.name!r}, step {step}, {state})"


def forks_of(run: Any, facade: Any) -> Forks:
    """The run's branches, its own state becoming branch ``"main"`` on first use."""
    if run.forks is None:
        run.forks = Forks(run, facade)
        main = Branch("main", run.forks, None)
        run.forks.branches["main"], run.forks.active = main, main
    return run.forks


def _new_name(taken: dict) -> str:
    """The first free name of a, b, ..., z, branch0, branch1, ..."""
    for c in string.ascii_lowercase:
        if c not in taken:
            return c
    return next(f"branch{i}" for i in itertools.count() if f"branch{i}" not in taken)


def fork(run: Any, n: Optional[int], facade: Any) -> Any:
    """``n`` new branches (one Branch for ``n=None``, else a list) from the active branch's state now; the active
    branch stays active."""
    if run.config.grpo.async_grpo.enabled:
        raise NotImplementedError("fork() with async GRPO: its producer samples ahead with the active weights; "
                                  "fork a session with grpo.async_grpo.enabled=false")
    forks = forks_of(run, facade)
    with run.rollouts.exclusive():
        now = park(run)
    made = []
    for _ in range(1 if n is None else n):
        name = _new_name(forks.branches)
        made.append(forks.branches.setdefault(name, Branch(name, forks, _copy(run, now))))
    return made[0] if n is None else made


def compare_branches(run: Any, facade: Any, num_prompts: Optional[int] = None, greedy: Optional[bool] = None) -> Any:
    """Held-out accuracy of every branch (the run's ``evaluate`` on each, the same prompts), as a DataFrame with
    the branch's step and policy version; the branch active before stays active."""
    forks = forks_of(run, facade)
    was = forks.active
    rows = []
    try:
        for name, branch in list(forks.branches.items()):
            branch.activate()
            result = run.evaluate(num_prompts, greedy)
            rows.append({"branch": name, "step": run.state.step, "policy_version": run.policy.version,
                         "accuracy": result.accuracy})
    finally:
        was.activate()
    return pd.DataFrame(rows).set_index("branch")
