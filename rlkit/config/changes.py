"""What a change of each config key needs before it takes effect: the one table that ``Session.configure``,
``Session.reset`` and sweeps read.

Why one table: a key is either read where it is used (a change is live), or it was baked into something
the session built from it (the rollout source, the loss, the optimizer, the engines). Listing that once,
next to the reason, keeps ``configure`` from accepting a change it then ignores. The longest matching
prefix decides; a key that no prefix names needs a new session (a new section is safe until someone
says otherwise).

``configure()`` applies LIVE, MODELS, ROLLOUTS, LOSS and OPTIMIZER changes in place and refuses RUN and SESSION;
``reset()`` starts a fresh run with anything short of SESSION.
"""

from __future__ import annotations

from enum import Enum
from typing import Any, Optional

from rlkit.config.run import RunConfig


class Change(Enum):
    """What a changed key needs; ``rlkit.builders.REBUILDS`` maps each to the one action that rebuilds it."""

    LIVE = "nothing: it is read where it is used"
    ROLLOUTS = "a new rollout source (how many prompts and samples a step draws, dynamic sampling)"
    LOSS = "a new loss function (RLLoss is built from loss_fn.* and grpo.reward_kl_coef)"
    OPTIMIZER = "a new optimizer and schedule (Adam moments and the schedule start over)"
    MODELS = "the critic or the distillation teacher built (or released): critic.enabled, distillation.enabled, their folders"
    RUN = "a new run (session.reset([...]): the seed orders the prompts and seeds the RNGs from step 0)"
    SESSION = "a new Session (Session.from_config(..., overrides=...)): the engines, data or environment use it"


CHANGES: tuple[tuple[str, Change], ...] = (
    ("name", Change.LIVE),
    ("seed", Change.RUN),
    ("grpo", Change.LIVE),  # advantages, epochs, overlong shaping, val_period ... are read per call
    ("grpo.num_prompts_per_step", Change.ROLLOUTS),
    ("grpo.num_generations_per_prompt", Change.ROLLOUTS),  # async: batches queued with the old G are dropped
    ("grpo.use_dynamic_sampling", Change.ROLLOUTS),
    ("grpo.dynamic_sampling_max_gen_batches", Change.ROLLOUTS),
    ("grpo.reward_kl_coef", Change.LOSS),  # the loss must then compute reference logprobs
    ("grpo.async_grpo", Change.SESSION),  # the async source and the off-policy config checks are built for it
    ("loss_fn", Change.LOSS),
    ("policy", Change.SESSION),
    ("policy.optimizer", Change.OPTIMIZER),
    ("policy.scheduler", Change.OPTIMIZER),
    ("sft", Change.LIVE),
    ("dpo", Change.LIVE),
    ("reward_model", Change.LIVE),
    ("critic", Change.LIVE),  # lr, value_clip, micro batch, grad norm: read by each critic call (Critic.use)
    ("critic.enabled", Change.MODELS),  # PPO's critic built (or released) in place
    ("critic.model_name", Change.MODELS),
    ("critic.backend", Change.MODELS),
    ("distillation", Change.LIVE),  # the advantages read it per call (its teacher: below)
    ("distillation.enabled", Change.MODELS),
    ("distillation.teacher_model_name", Change.MODELS),
    ("eval", Change.LIVE),
    ("logger", Change.LIVE),
    ("checkpointing", Change.LIVE),
    ("history", Change.LIVE),  # read at each step's record
    ("env.max_reward_failure_fraction", Change.LIVE),  # read at each score()
)


def change_for(key: str) -> Change:
    """The change a new value of the dotted ``key`` needs (longest matching prefix of :data:`CHANGES`)."""
    matches = [(len(prefix), change) for prefix, change in CHANGES if key == prefix or key.startswith(prefix + ".")]
    return max(matches, key=lambda m: m[0])[1] if matches else Change.SESSION


def _changed_keys(old: Any, new: Any, prefix: str = "") -> list[str]:
    """Dotted keys whose values differ between two nested dicts."""
    if not (isinstance(old, dict) and isinstance(new, dict)):
        return [prefix] if old != new else []
    return [k for key in sorted(set(old) | set(new))
            for k in _changed_keys(old.get(key), new.get(key), f"{prefix}.{key}" if prefix else key)]


def _dotted(values: dict, key: str) -> Any:
    for part in key.split("."):
        values = values.get(part) if isinstance(values, dict) else None
    return values


def config_changes(old: RunConfig, new: RunConfig) -> dict[str, tuple[Any, Any]]:
    """Dotted key -> (old value, new value) for every leaf setting that differs."""
    a, b = old.model_dump(mode="json"), new.model_dump(mode="json")
    return {key: (_dotted(a, key), _dotted(b, key)) for key in _changed_keys(a, b)}


def changes_needed(old: RunConfig, new: RunConfig) -> dict[str, Change]:
    """``{dotted key: Change}`` for every key whose value differs between ``old`` and ``new``."""
    return {key: change_for(key) for key in config_changes(old, new)}


def refusals(changes: dict[str, Change], allowed: set[Change], where: str) -> list[str]:
    """One ConfigError line per change that ``where`` (``configure()``, ``reset()``) cannot make."""
    return [f"{key}: changing it needs {change.value}; {where} cannot change it"
            for key, change in changes.items() if change not in allowed]


def changes_summary(old: RunConfig, new: RunConfig, changes: dict[str, Change], new_loss: Optional[str] = None) -> str:
    """What ``configure()`` changed: one line per key, ``key: old -> new``, and what the change needed
    (``new_loss``: a description of the loss it built, None when it kept a loss function of yours, which the
    change does not reach)."""
    if not changes:
        return "configure(): nothing changed"
    needed = {Change.LIVE: "live: read at its next use",
              Change.ROLLOUTS: "new rollout source from the next rollout()",
              Change.LOSS: f"new loss: {new_loss}" if new_loss is not None
              else "your loss function is kept: the change does not reach it",
              Change.OPTIMIZER: "new optimizer and schedule (Adam moments and the schedule restart)",
              Change.MODELS: "built (or released) in place, the engines kept"}
    before, after = old.model_dump(mode="json"), new.model_dump(mode="json")
    rows = [(key, f"{_dotted(before, key)!r} -> {_dotted(after, key)!r}", needed.get(change, change.value))
            for key, change in changes.items()]
    width = max(len(k) for k, _, _ in rows), max(len(v) for _, v, _ in rows)
    lines = [f"  {k:<{width[0]}}  {v:<{width[1]}}  {n}" for k, v, n in rows]
    return f"configure(): {len(rows)} setting(s) changed\n" + "\n".join(lines)
