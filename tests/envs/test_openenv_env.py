"""OpenEnvEnvironment against a real OpenEnv server (openenv-core's create_app, served by uvicorn on 127.0.0.1).

The environment below is written the way OpenEnv's docs write one: Action/Observation/State pydantic types, an
``Environment`` subclass with ``reset``/``step``/``state``, ``create_app`` for the server, and for the typed case an
``EnvClient`` subclass with ``_step_payload``/``_parse_result``/``_parse_state``. Its reward is a pure function of the
message (half a point per digit, plus the ``seed`` given to ``reset``), so the expected rewards are written by hand.
"""

from __future__ import annotations

import socket
import threading
import time
from typing import Any, Optional

import pytest

pytest.importorskip("openenv.core")
import uvicorn  # noqa: E402
from openenv.core import EnvClient  # noqa: E402
from openenv.core.client_types import StepResult  # noqa: E402
from openenv.core.env_server import Action, Environment, Observation, State, create_app  # noqa: E402

import rlkit  # noqa: E402
from rlkit.envs.openenv_env import OpenEnvEnvironment  # noqa: E402


class DigitAction(Action):
    message: str


class DigitObservation(Observation):
    digits: int = 0
    echoed: str = ""


class DigitEnvironment(Environment):
    """Reward: 0.5 per digit in the message, plus the reset's seed; the message "boom" makes step raise."""

    SUPPORTS_CONCURRENT_SESSIONS = True

    def __init__(self) -> None:
        super().__init__()
        self._state = State(episode_id="", step_count=0)
        self._bonus = 0.0

    def reset(self, seed: Optional[int] = None, episode_id: Optional[str] = None, **kwargs: Any) -> DigitObservation:
        self._state = State(episode_id=episode_id or "episode", step_count=0)
        self._bonus = float(seed or 0)
        return DigitObservation(done=False, reward=0.0)

    def step(self, action: DigitAction, timeout_s: Optional[float] = None, **kwargs: Any) -> DigitObservation:
        if action.message == "boom":
            raise ValueError("the environment refuses 'boom'")
        self._state.step_count += 1
        digits = sum(ch.isdigit() for ch in action.message)
        return DigitObservation(done=True, reward=0.5 * digits + self._bonus, digits=digits, echoed=action.message)

    @property
    def state(self) -> State:
        return self._state


class DigitClient(EnvClient[DigitAction, DigitObservation, State]):
    """The typed client, as an OpenEnv environment package ships it."""

    def _step_payload(self, action: DigitAction) -> dict[str, Any]:
        return {"message": action.message}

    def _parse_result(self, payload: dict[str, Any]) -> StepResult[DigitObservation]:
        obs = payload.get("observation", {})
        return StepResult(observation=DigitObservation(done=payload.get("done", False), reward=payload.get("reward"),
                                                       digits=obs.get("digits", 0), echoed=obs.get("echoed", "")),
                          reward=payload.get("reward"), done=payload.get("done", False))

    def _parse_state(self, payload: dict[str, Any]) -> State:
        return State(**payload)


@pytest.fixture(scope="module")
def server_url():
    app = create_app(DigitEnvironment, DigitAction, DigitObservation, max_concurrent_envs=4)
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning"))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    deadline = time.monotonic() + 30
    while not server.started:
        if time.monotonic() > deadline or not thread.is_alive():
            pytest.fail("the OpenEnv test server did not start")
        time.sleep(0.05)
    yield f"http://127.0.0.1:{port}"
    server.should_exit = True
    thread.join(timeout=10)


def convo(completion: str) -> list[dict[str, str]]:
    return [{"role": "user", "content": "say digits"}, {"role": "assistant", "content": completion}]


def test_rewards_are_the_environments(server_url):
    with OpenEnvEnvironment(server_url, action="message") as env:
        out = env.step([convo("12"), convo("no digits"), convo("a1b2c3d")], [{}, {}, {}])
    assert out.rewards.tolist() == [1.0, 0.0, 1.5]
    assert out.done.tolist() == [True, True, True]
    assert out.errors == []
    assert out.metadata[2]["observation"]["digits"] == 3
    assert out.metadata[2]["observation"]["echoed"] == "a1b2c3d"
    assert out.metadata[0]["env_done"] is True


def test_typed_client_and_reset_kwargs(server_url):
    env = OpenEnvEnvironment(server_url, action=lambda text: DigitAction(message=text), client_cls=DigitClient,
                             reset_kwargs=lambda row: {"seed": row["bonus"]})
    try:
        out = env.step([convo("7"), convo("77")], [{"bonus": 2}, {"bonus": 0}])
    finally:
        env.close()
    assert out.rewards.tolist() == [2.5, 1.0]
    assert out.metadata[1]["observation"]["echoed"] == "77"


def test_a_failed_step_costs_only_its_sample(server_url):
    with OpenEnvEnvironment(server_url, action="message") as env:
        out = env.step([convo("1"), convo("boom"), convo("333")], [{}, {}, {}])
    assert out.rewards.tolist() == [0.5, 0.0, 1.5]
    assert len(out.errors) == 1 and out.errors[0].startswith("sample 1: ")
    assert out.metadata[1] == {}


def test_an_unreachable_server_is_a_per_sample_error():
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]  # closed again: nothing listens there
    with OpenEnvEnvironment(f"http://127.0.0.1:{port}", action="message") as env:
        out = env.step([convo("1")], [{}])
    assert out.rewards.tolist() == [0.0]
    assert "ConnectionError" in out.errors[0]


def test_session_step_uses_the_environments_rewards(server_url, tmp_path):
    env = OpenEnvEnvironment(server_url, action="message")
    overrides = {"policy.model_name": str(tmp_path / "model"), "sft.enabled": False,
                 "logger.log_dir": str(tmp_path / "runs")}
    with rlkit.Session.from_config("quickstart_nano", overrides, env=env) as session:
        batch = session.score(session.rollout())
        expected = [0.5 * sum(ch.isdigit() for ch in c) for c in batch.completions]
        assert batch.rewards.tolist() == expected
        assert len(set(expected)) > 1  # the untrained nano model writes digits in some completions, not all
        assert batch.reward_errors == ()
        assert [m["observation"]["echoed"] for m in batch.env_metadata] == list(batch.completions)
        metrics = session.train(session.advantages(session.logprobs(batch)))
    assert metrics["rollout/reward_mean"] == pytest.approx(sum(expected) / len(expected))
