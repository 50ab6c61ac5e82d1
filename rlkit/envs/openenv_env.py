"""An OpenEnv environment as an rlkit environment: reset, step with the completion, take the reward.

Why: OpenEnv (Meta's ``openenv-core``) packages an environment as a server with ``reset``/``step`` and a client class
that talks to it; environments written for it (echo, coding, games, ...) run anywhere, a Docker container or a
Hugging Face Space. This adapter reaches such a server through OpenEnv's own client (``GenericEnvClient`` by default,
or the environment's typed client class), so rlkit trains against it without knowing how it is built.

For each sample: ``reset`` (with ``reset_kwargs(row)`` when given: a seed, a task id), then one ``step`` whose action
is built from the completion, then the step's ``reward`` is the sample's reward and the observation (as a dict) goes
into the sample's metadata. How the action is built is the environment's business: ``action="message"`` sends
``{"message": completion}`` (what ``GenericEnvClient`` expects); a callable builds the action itself
(``lambda text: EchoAction(message=text)`` for a typed client).

Failures are per sample, as elsewhere in rlkit: a call that raises (the server refused the action, the connection
dropped, the step timed out) or a step without a numeric reward gives that sample reward 0 and one message in
``errors``; the connection is then opened afresh for the next sample, so one broken exchange does not poison the
rest of the batch.

Deliberate simplifications: single-turn only (one ``step`` per episode; an episode the server has not ended is
ended here, and its ``done`` is recorded as ``env_done`` in the metadata; multi-turn OpenEnv episodes are left for
later); samples are played one after another over one connection (one server session), not concurrently; the server
is not started here (``from_docker_image``/``from_env`` are OpenEnv's business: start it, then pass its URL).
"""

from __future__ import annotations

from typing import Any, Callable, Mapping, Optional

from rlkit.envs.base import (
    Conversation,
    Environment,
    EnvReturn,
    as_reward,
    check_batch,
    completion_of,
    sample_error,
)
from rlkit.errors import RLKitError

INSTALL = "pip install openenv-core==0.3.0 (rlkit's lock installs it without gradio: see docs/howto/ecosystem-envs.md)"

ActionBuilder = Callable[[str], Any]  # completion text -> the action the client's step() takes


class OpenEnvMissing(RLKitError, ImportError):
    """openenv-core is not installed, and an OpenEnv environment needs it."""


def _generic_client_class() -> type:
    try:
        from openenv.core import GenericEnvClient
    except ImportError as exc:
        raise OpenEnvMissing(f"openenv-core is not installed ({exc}); OpenEnvEnvironment needs it. "
                             f"Fix: {INSTALL}") from exc
    return GenericEnvClient


def _as_dict(observation: Any) -> dict[str, Any]:
    """A typed observation (a pydantic model) as a plain dict; GenericEnvClient's is one already."""
    if hasattr(observation, "model_dump"):
        return observation.model_dump()
    return dict(observation) if isinstance(observation, Mapping) else {"value": observation}


class OpenEnvEnvironment(Environment):
    """A single-turn rlkit environment over an OpenEnv server at ``base_url``.

    ``action``: the name of the action's text field (``{field: completion}``), or a callable that builds the action
    from the completion. ``client_cls``: the environment's OpenEnv client class (default ``GenericEnvClient``, which
    sends dicts). ``reset_kwargs``: ``row -> dict`` of keyword arguments for ``reset`` (default: none).
    """

    def __init__(self, base_url: str, action: str | ActionBuilder, client_cls: Optional[type] = None,
                 reset_kwargs: Optional[Callable[[dict[str, Any]], dict[str, Any]]] = None,
                 name: Optional[str] = None, message_timeout_s: float = 60.0):
        if not isinstance(base_url, str) or not base_url:
            raise ValueError(f"OpenEnvEnvironment needs the server's base URL (http://host:port), got {base_url!r}")
        if isinstance(action, str):
            field = action
            self.build_action: ActionBuilder = lambda text: {field: text}
        elif callable(action):
            self.build_action = action
        else:
            raise TypeError("action must be the action's text field name or a callable completion -> action, "
                            f"got {type(action).__name__}")
        self.base_url = base_url
        self.client_cls = client_cls or _generic_client_class()
        self.reset_kwargs = reset_kwargs
        self.message_timeout_s = message_timeout_s
        self.name = name or f"openenv:{base_url}"
        self._client: Any = None

    def _connected(self) -> Any:
        """The synchronous client, connected (opened on first use, and again after a failed exchange)."""
        if self._client is None:
            client = self.client_cls(base_url=self.base_url, message_timeout_s=self.message_timeout_s).sync()
            client.connect()
            self._client = client
        return self._client

    def _drop_client(self) -> None:
        client, self._client = self._client, None
        if client is not None:
            try:
                client.close()
            except Exception:  # noqa: BLE001 - best effort: the connection is being dropped because it failed
                pass

    def _play(self, completion: str, row: dict[str, Any]) -> tuple[float, dict[str, Any]]:
        """One episode: reset, one step with the completion; the step's reward and observation."""
        client = self._connected()
        client.reset(**(self.reset_kwargs(row) if self.reset_kwargs else {}))
        result = client.step(self.build_action(completion))
        observation = _as_dict(result.observation)
        if result.reward is None:
            raise ValueError(f"the environment's step returned no reward (observation: {observation!r})")
        return as_reward(result.reward), {"observation": observation, "env_done": bool(result.done)}

    def step(self, conversations: list[Conversation], rows: list[dict[str, Any]]) -> EnvReturn:
        check_batch(conversations, rows)
        rewards, metadata, errors = [], [], []
        for i, (conversation, row) in enumerate(zip(conversations, rows)):
            try:
                reward, meta = self._play(completion_of(conversation), row)
            except Exception as exc:  # noqa: BLE001 - one failed exchange costs this sample its reward only
                self._drop_client()
                reward, meta = 0.0, {}
                errors.append(sample_error(i, exc))
            rewards.append(reward)
            metadata.append(meta)
        return EnvReturn.single_turn(rewards, metadata, errors)

    def close(self) -> None:
        self._drop_client()

    def __repr__(self) -> str:
        return f"OpenEnvEnvironment(base_url={self.base_url!r}, client={self.client_cls.__name__})"
