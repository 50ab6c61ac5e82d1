"""Agent rollout stage: your agent, written against the OpenAI client, plays episodes; rlkit keeps the tokens.

``agent`` is ``async def agent(client, row) -> reward``, where ``client`` is an ``openai.AsyncOpenAI`` pointed at
an :class:`rlkit.generation.openai_server.OpenAIEndpoint` episode URL: the agent calls
``client.chat.completions.create(model=..., messages=..., tools=...)``, runs its tools, and returns a number.
Or it returns the conversation (a list of messages) and ``env`` scores the episodes together (a judge, a weighted
list: :mod:`rlkit.envs.judge`); a returned message object of the client counts as its dict.

Each of ``len(rows) x num_generations`` episodes runs concurrently (the endpoint batches their requests into
engine calls) and becomes one row of :class:`Trajectories`: the ids the engine sampled from and sampled, the
generator's logprobs, ``loss_mask`` True exactly on the sampled tokens (every turn's; the prompt, tool results and
template tokens are attended, not trained on), ``rewards`` the agent's (or ``env``'s). Every stage after this one
works on it as on the multi-turn rollout's rows.

Failures: an agent that raises ends its episode with reward 0 and a message in ``reward_errors``; too many (more
than ``max_failure_fraction``, or all) raise ``RewardError`` as for any reward. An episode that made no request is
an agent failure too.

Deliberate simplifications: rewards are the episode's (credited to its last sampled token); an episode's row is
the branch of its last recorded sample (:meth:`rlkit.generation.openai_server.Episode.final`).
"""

from __future__ import annotations

import asyncio
import threading
import uuid
from typing import Any, Awaitable, Callable, Optional, Sequence

import torch

from rlkit.envs.base import MAX_REWARD_FAILURE_FRACTION, Environment, as_reward, sample_error
from rlkit.errors import RewardError
from rlkit.generation.openai_server import Branch, OpenAIEndpoint
from rlkit.stages.score import check_reward_failures
from rlkit.trajectories import Trajectories

Agent = Callable[[Any, dict[str, Any]], Awaitable[Any]]  # async (client, row) -> reward or messages


def run_coroutine(coroutine: Awaitable[Any]) -> Any:
    """``asyncio.run(coroutine)``, also from a notebook cell (whose loop is already running: then in a thread)."""
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return asyncio.run(coroutine)
    box: dict[str, Any] = {}

    def target() -> None:
        try:
            box["value"] = asyncio.run(coroutine)
        except BaseException as exc:  # noqa: BLE001 - re-raised in the caller's thread
            box["error"] = exc

    thread = threading.Thread(target=target, name="rlkit-agents")
    thread.start()
    thread.join()
    if "error" in box:
        raise box["error"]
    return box["value"]


def agent_rollout(endpoint: OpenAIEndpoint, agent: Agent, rows: Sequence[dict[str, Any]], num_generations: int,
                  policy_version: int, env: Optional[Environment] = None,
                  max_failure_fraction: float = MAX_REWARD_FAILURE_FRACTION) -> Trajectories:
    """``len(rows) x num_generations`` agent episodes through ``endpoint`` -> scored Trajectories."""
    import openai

    tag = uuid.uuid4().hex[:8]
    names = [f"{tag}-{i}" for i in range(len(rows) * num_generations)]
    episode_rows = [rows[i // num_generations] for i in range(len(names))]

    async def one(name: str, row: dict[str, Any]) -> Any:
        async with openai.AsyncOpenAI(base_url=endpoint.episode_url(name), api_key="rlkit", max_retries=0) as client:
            return await agent(client, row)

    async def all_episodes() -> list[Any]:
        return await asyncio.gather(*(one(n, r) for n, r in zip(names, episode_rows)), return_exceptions=True)

    results = run_coroutine(all_episodes())
    rewards, errors, conversations = [0.0] * len(names), [], {}
    metadata: list[dict[str, Any]] = [{} for _ in names]  # the env's per episode (its reward components...)
    for i, (name, result) in enumerate(zip(names, results)):
        if name not in endpoint.episodes or not endpoint.episodes[name].branches:
            result = result if isinstance(result, BaseException) else RuntimeError("the agent made no request")
        if isinstance(result, BaseException):
            errors.append(sample_error(i, result))
        elif isinstance(result, (list, tuple)):
            conversations[i] = [m if isinstance(m, dict) else m.model_dump(exclude_none=True) for m in result]
        else:
            try:
                rewards[i] = as_reward(result)
            except (TypeError, ValueError) as exc:
                errors.append(sample_error(i, exc))
    if conversations:
        if env is None:
            raise RewardError("the agent returned messages but agent_rollout got no env to score them; pass env=, "
                              "or return the reward from the agent")
        order = sorted(conversations)
        scored = env.step([conversations[i] for i in order], [episode_rows[i] for i in order])
        for local, i in enumerate(order):
            rewards[i], metadata[i] = float(scored.rewards[local]), dict(scored.metadata[local])
        errors += [m.replace(f"sample {local}: ", f"sample {order[local]}: ", 1)
                   for local in range(len(order)) for m in scored.errors if m.startswith(f"sample {local}: ")]
    branches = [endpoint.episodes[n].final() if n in endpoint.episodes and endpoint.episodes[n].branches else None
                for n in names]
    batch = episodes_as_trajectories(branches, rows, rewards, num_generations, policy_version, endpoint.tokenizer,
                                     errors, metadata)
    check_reward_failures(errors, batch, env.name if env is not None else "agent", max_failure_fraction)
    with endpoint._lock:  # the episodes are in the batch now; the endpoint keeps serving others
        for n in names:
            endpoint.episodes.pop(n, None)
    turns = [sum(g and not before for before, g in zip([False] + b.generated, b.generated)) if b else 0
             for b in branches]  # runs of sampled tokens: the episode's assistant turns
    return batch.with_(info={"reward_errors": len(errors),
                             "rollout/turns_mean": sum(turns) / len(turns)})


def episodes_as_trajectories(branches: Sequence[Optional[Branch]], rows: Sequence[dict[str, Any]],
                             rewards: Sequence[float], group_size: int, policy_version: int, tokenizer: Any,
                             errors: Sequence[str] = (), metadata: Optional[Sequence[dict[str, Any]]] = None
                             ) -> Trajectories:
    """One row per episode, ``group_size`` episodes per prompt row of ``rows`` (an episode without a request:
    one pad token, masked out, reward 0)."""
    pad = tokenizer.pad_token_id
    ids = [b.ids if b else [pad] for b in branches]
    t = max(len(x) for x in ids)
    b = len(branches)
    input_ids = torch.tensor([x + [pad] * (t - len(x)) for x in ids], dtype=torch.long)
    loss_mask = torch.tensor([(br.generated if br else [False]) + [False] * (t - len(x)) for br, x in zip(branches, ids)])
    logprobs = torch.tensor([(br.logprobs if br else [0.0]) + [0.0] * (t - len(x)) for br, x in zip(branches, ids)])
    attention_mask = torch.arange(t) < torch.tensor([len(x) if br else 0 for br, x in zip(branches, ids)]).unsqueeze(1)
    turn_rewards = torch.zeros(b, t)
    for i, br in enumerate(branches):
        if br is not None:
            turn_rewards[i, len(br.ids) - 1] = rewards[i]
    split = [br.prompt_length if br else 0 for br in branches]
    return Trajectories(
        prompts=tuple(tokenizer.decode(x[:k], skip_special_tokens=False) for x, k in zip(ids, split)),
        completions=tuple(tokenizer.decode(x[k:], skip_special_tokens=False) if br else ""
                          for x, k, br in zip(ids, split, branches)),
        input_ids=input_ids, attention_mask=attention_mask, loss_mask=loss_mask, generator_logprobs=logprobs,
        finish_reasons=tuple(br.finish_reason if br else "stop" for br in branches), group_size=group_size,
        policy_version=policy_version, rows=tuple(rows), rewards=turn_rewards.sum(1), turn_rewards=turn_rewards,
        reward_errors=tuple(errors), tokenizer=tokenizer,
        env_metadata=tuple(metadata) if metadata is not None else tuple({} for _ in branches),
    )
