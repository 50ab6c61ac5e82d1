"""reasoning-gym's tasks scored by their own ``score_answer``: the environment ``env.name: reasoning_gym``.

Why: reasoning-gym (``pip install rlkit[reasoning-gym]``) generates a hundred verifiable tasks in process (chain
sums, countdown, sudoku, ...), each with its own scorer; papers train RLVR on them without a download. rlkit's rows
for them come from :mod:`rlkit.data.reasoning_gym` (``data.task: reasoning_gym:<name>``), and each row carries
what its scorer needs, so a row scores itself whatever mix it came from:

- ``task``: the reasoning-gym name of the task that made the entry (a composite's entry: its ``source_dataset``);
- ``task_config``: that task's generator config as JSON (``data.task_config``, without ``seed`` and ``size``): a
  scorer may read its config;
- ``answer``: the entry's oracle answer (text, or None for tasks with many right answers, whose scorer checks the
  answer against ``metadata``);
- ``metadata``: the entry's metadata as JSON, its Python types kept (:func:`encode_metadata`: a scorer that
  compares tuples must get tuples back, which plain JSON would turn into lists);
- ``answer_tag``: whether the prompt asks for ``<answer>...</answer>`` (the system prompt or the question says so).

The answer handed to ``score_answer``: with ``answer_tag``, reasoning-gym's own extractor
(``reasoning_gym.utils.extract_answer``: the last ``<answer>`` tag's text, None without one, which its scorers give
0 or their floor); else the completion's text, stripped: a chat model asked a plain question answers in plain text.
With ``answer_from="last_number"`` (``env.answer_from``, :mod:`rlkit.envs.answers`) it is the last number written in
the tag's text when the prompt asks for a tag and the completion has one, else in the whole completion (None without
a number): the lenient rule, for numeric tasks and a chat model that writes its working ("27 + 82 = 109"); it does not
demand the tag. The entry handed to it is rebuilt from the row: ``question`` (the prompt the completion answers, as
``data.prompt_template`` made it; no reasoning-gym scorer reads it), ``answer``, ``metadata``. The environment's
metadata gives each sample's answer as ``parsed``.

reasoning-gym is imported on first use, so rlkit imports without it; :func:`import_reasoning_gym` says what to
install. The reward goes through :class:`rlkit.envs.reward_fn.RewardFunctionEnvironment`, so a completion whose
scoring raises costs that sample its reward, not the step.

Deliberate simplifications: one scorer (dataset object) per (task, config) is built and cached for the process;
the task's ``score_answer`` is trusted to be pure (reasoning-gym's are); no partial-format reward for a missing tag.
"""

from __future__ import annotations

import dataclasses
import functools
import json
from typing import Any, Optional, Sequence

from rlkit.envs.answers import AnswerFrom, check_answer_from, last_number
from rlkit.envs.base import Conversation, EnvReturn, completion_of
from rlkit.envs.reward_fn import RewardFunctionEnvironment
from rlkit.errors import RLKitError

INSTALL = "pip install rlkit[reasoning-gym] (or pip install reasoning-gym==0.1.25)"
SET_BY_RLKIT = ("seed", "size")  # generator keys rlkit sets itself, from data.seed and data.num_train/num_validation
ANSWER_TAG = "<answer>"


class ReasoningGymMissing(RLKitError, ImportError):
    """reasoning-gym is not installed, and a task or the environment needs it."""


def import_reasoning_gym() -> Any:
    """The ``reasoning_gym`` module, or :class:`ReasoningGymMissing` naming the install command."""
    try:
        import reasoning_gym
    except ImportError as exc:
        raise ReasoningGymMissing(f"reasoning-gym is not installed ({exc}); the reasoning_gym tasks and environment "
                                  f"need it. Fix: {INSTALL}") from exc
    return reasoning_gym


def _registry() -> dict[str, tuple[type, type]]:
    """reasoning-gym's table of tasks: name -> (dataset class, config dataclass)."""
    import_reasoning_gym()
    from reasoning_gym.factory import DATASETS

    return DATASETS


def task_names() -> tuple[str, ...]:
    """Every task name reasoning-gym registers (``composite`` included: the weighted mix), sorted."""
    return tuple(sorted(_registry()))


def task_description(name: str) -> str:
    """The first line of the task's dataset class docstring ("" when it has none)."""
    doc = (_registry()[name][0].__doc__ or "").strip()
    return doc.splitlines()[0].strip() if doc else ""


def config_keys(name: str) -> tuple[str, ...]:
    """The generator config keys of task ``name`` that ``data.task_config`` may set (not ``seed`` / ``size``)."""
    return tuple(f.name for f in dataclasses.fields(_registry()[name][1]) if f.name not in SET_BY_RLKIT)


def config_defaults(name: str) -> dict[str, Any]:
    """The generator keys of task ``name`` that ``data.task_config`` may set, with their defaults (None for a key
    without one)."""
    out = {}
    for f in dataclasses.fields(_registry()[name][1]):
        if f.name not in SET_BY_RLKIT:
            has_factory = f.default_factory is not dataclasses.MISSING
            out[f.name] = (f.default_factory() if has_factory
                           else None if f.default is dataclasses.MISSING else f.default)
    return out


def check_config(name: str, config: dict[str, Any]) -> Optional[str]:
    """Why reasoning-gym's config of task ``name`` refuses ``config`` (its own ``validate()``), or None."""
    try:
        made = _registry()[name][1](**config)
        if callable(getattr(made, "validate", None)):
            made.validate()
    except (AssertionError, ValueError, TypeError) as exc:
        return f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__
    return None


# --- metadata as a JSON string column, Python types kept --------------------------------------------------------

_TUPLE, _SET, _ITEMS = "__tuple__", "__set__", "__items__"


def _tagged(value: Any) -> Any:
    if isinstance(value, tuple):
        return {_TUPLE: [_tagged(v) for v in value]}
    if isinstance(value, (set, frozenset)):
        return {_SET: [_tagged(v) for v in sorted(value, key=repr)]}
    if isinstance(value, list):
        return [_tagged(v) for v in value]
    if isinstance(value, dict):
        if all(isinstance(k, str) for k in value) and not {_TUPLE, _SET, _ITEMS} & set(value):
            return {k: _tagged(v) for k, v in value.items()}
        return {_ITEMS: [[_tagged(k), _tagged(v)] for k, v in value.items()]}  # int or tuple keys kept
    return value


def _untagged(value: Any) -> Any:
    if isinstance(value, list):
        return [_untagged(v) for v in value]
    if isinstance(value, dict):
        if set(value) == {_TUPLE}:
            return tuple(_untagged(v) for v in value[_TUPLE])
        if set(value) == {_SET}:
            return {_untagged(v) for v in value[_SET]}
        if set(value) == {_ITEMS}:
            return {_untagged(k): _untagged(v) for k, v in value[_ITEMS]}
        return {k: _untagged(v) for k, v in value.items()}
    return value


def encode_metadata(metadata: Any) -> str:
    """``metadata`` as JSON text that :func:`decode_metadata` reads back with tuples, sets and non-text dict keys
    as they were; values JSON has no type for (numpy scalars, objects) become their ``str``."""
    return json.dumps(_tagged(metadata), default=str)


def decode_metadata(text: str) -> Any:
    """What :func:`encode_metadata` wrote, as the Python value it came from."""
    return _untagged(json.loads(text))


# --- the reward ---------------------------------------------------------------------------------------------------


def extract_answer(completion: str, answer_tag: bool, answer_from: AnswerFrom = "completion") -> Optional[str]:
    """The answer ``score_answer`` is given: the last ``<answer>`` tag's text when the prompt asks for the tag
    (reasoning-gym's own extractor; None without a tag), else the completion stripped. With
    ``answer_from="last_number"``: the last number in the tag's text when there is a tag, else in the completion."""
    tagged = None
    if answer_tag:
        import_reasoning_gym()
        from reasoning_gym.utils import extract_answer as extract

        tagged = extract(completion)
    if answer_from == "last_number":
        return last_number(completion if tagged is None else tagged)
    return tagged if answer_tag else completion.strip()


@functools.lru_cache(maxsize=256)
def scorer(task: str, task_config: str) -> Any:
    """The reasoning-gym dataset whose ``score_answer`` scores ``task``'s entries (``task_config``: its config as
    JSON), built once per process; ``size=1``, as only its scorer is used."""
    rg = import_reasoning_gym()
    return rg.create_dataset(task, **json.loads(task_config or "{}"), seed=0, size=1)


def reasoning_gym_reward(prompts: Sequence[str], completions: Sequence[str], *, task: Sequence[str],
                         task_config: Sequence[str], answer: Sequence[Optional[str]], metadata: Sequence[str],
                         answer_tag: Optional[Sequence[bool]] = None, answer_from: AnswerFrom = "completion",
                         **_: Any) -> list[float]:
    """Each completion scored by its row's task, ``[B]`` floats:
    ``score_answer(extract_answer(completion, tag, answer_from), entry)``.

    The columns are the rows' (:mod:`rlkit.data.reasoning_gym`), as lists; other columns are ignored.
    """
    tags = answer_tag if answer_tag is not None else [False] * len(completions)
    out = []
    for i, completion in enumerate(completions):
        entry = {"question": prompts[i], "answer": answer[i], "metadata": decode_metadata(metadata[i])}
        given = extract_answer(completion, bool(tags[i]), answer_from)
        out.append(float(scorer(task[i], task_config[i]).score_answer(given, entry)))
    return out


class ReasoningGymEnvironment(RewardFunctionEnvironment):
    """The reward of rows made by ``data.task: reasoning_gym:<name>``: each task's own ``score_answer``."""

    def __init__(self, answer_from: AnswerFrom = "completion") -> None:
        import_reasoning_gym()  # refuse at build time, naming the install, not at the first scored batch
        self.answer_from = check_answer_from(answer_from)
        # the plain function by default, which a checkpoint of a session given this environment can import again
        fn = reasoning_gym_reward if answer_from == "completion" else functools.partial(reasoning_gym_reward,
                                                                                         answer_from=answer_from)
        super().__init__(fn, name="reasoning_gym")

    def step(self, conversations: list[Conversation], rows: list[dict[str, Any]]) -> EnvReturn:
        """The reward function's return, each sample's metadata with ``parsed``: the answer its scorer was given
        (None where there was none, or where the completion could not be read)."""
        out = super().step(conversations, rows)
        metadata = []
        for conversation, row, facts in zip(conversations, rows, out.metadata):
            try:
                parsed = extract_answer(completion_of(conversation), bool(row.get("answer_tag")), self.answer_from)
            except Exception:  # noqa: BLE001 - the reward already reported this sample's failure in errors
                parsed = None
            metadata.append({**facts, "parsed": parsed})
        return dataclasses.replace(out, metadata=metadata)

    def __repr__(self) -> str:
        return "ReasoningGymEnvironment()" if self.answer_from == "completion" else \
            f"ReasoningGymEnvironment(answer_from={self.answer_from!r})"
