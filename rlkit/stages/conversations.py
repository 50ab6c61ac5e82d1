"""Multi-turn rollout stage: play whole conversations with the environment, one row of Trajectories each.

A conversation alternates the policy's turns and the environment's answers: generate, ``env.step`` (reward,
done, next message), append the message's tokens, generate again from the whole sequence, until the
environment says done, ``max_turns`` assistant turns were played, or the token budget ``max_total_tokens``
(the engine's length) is spent. Tokens go in and come out as ids, never re-tokenized: the sequence the
policy is trained on is exactly the one the generator sampled from, so the generator's logprob of each
generated token (kept per token, across turns) lines up with the trainer's, and the mismatch and IS-correction
stages work unchanged.

Masks. ``loss_mask`` is True exactly on the tokens the policy generated (each turn's tokens, its EOS
included); the prompt, the environment's messages and the chat-template tokens around them are attended
(``attention_mask``) but never trained on and never counted by the loss's normalisation (the aggregations
count ``loss_mask``). So ``loss_mask`` has holes inside a row; every stage after this one already works by mask.

Rewards. Every ``env.step`` reward is credited to the last generated token of the turn it answers
(``turn_rewards`` ``[B, T]``); ``rewards`` ``[B]`` is their sum, the conversation's return with no discount,
which the group estimators (GRPO, RLOO...) use as the outcome reward. The batch comes back scored: the
session's score stage keeps it as it is. Discounted per-token returns over the holes are
:func:`rlkit.algorithms.returns.discounted_returns`.

The environment's message (or messages: one ``tool`` message per native tool call) is turned into tokens by
rendering the chat template twice (the conversation with and without the messages, the latter ending after the
assistant's turn) and tokenizing the difference; a turn that did not end with EOS (cut by its token limit or a stop
string) gets the EOS as a template token first. Every render passes the environment's JSON tools
(``env.tool_schemas``, else ``settings.tools``) and ``settings.chat_template_kwargs``, as the prompt's did.

Failures. An ``env.step`` that raises is repeated one conversation at a time, and a conversation whose step
raises alone ends there with reward 0 and its message in ``reward_errors`` (the score stage's rule: too many
failures raise ``RewardError``). A next message that is not text (``content`` a dict or a list) is the
environment's bug, refused with ``RewardError`` naming it. A message that does not fit the token budget ends its
conversation (finish reason ``length``) with a warning that counts them; one longer in characters than the room
left could hold (:func:`rlkit.data.lengths.max_token_chars`) is never rendered or tokenized.

Deliberate simplifications: the first turn samples ``G`` continuations of each prompt (prefix shared); later
turns sample one continuation of each live conversation, in as few engine calls as there are distinct
per-turn token limits. Conversations that end early wait for the others (no continuous batching across turns).
DAPO's overlong reward shaping (``grpo.overlong_buffer_length``) belongs to the single-turn score stage and is
not applied to conversations; a truncated conversation shows as finish reason ``length``.
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass, field, replace
from typing import Any, Optional, Sequence

import torch

from rlkit.data import render_prompt_texts
from rlkit.data.chat import appended_message_ids
from rlkit.data.lengths import max_token_chars
from rlkit.envs.base import Environment, EnvReturn, error_sample_index, sample_error
from rlkit.errors import RewardError
from rlkit.generation.base import Generation, Generator, SamplingSettings
from rlkit.stages.score import check_reward_failures
from rlkit.stages.settings import RolloutSettings
from rlkit.trajectories import Trajectories

TURN_SEED_STRIDE = 104_729  # turn k's engine calls sample with seed + k * stride (+ the call's index)


def is_multi_turn(env: Any) -> bool:
    """True for an environment that may answer with a next message (``env.max_turns > 1``)."""
    return getattr(env, "max_turns", 1) > 1


def rollout_tools(env: Environment, settings: RolloutSettings) -> Optional[Sequence[dict[str, Any]]]:
    """The environment's JSON tools (``env.tool_schemas``, a native-tool environment), else the settings'."""
    return getattr(env, "tool_schemas", None) or settings.tools


@dataclass
class _Conversation:
    """One conversation being played: its tokens (ids, which ones the policy generated, their logprobs)."""

    rows_index: int
    messages: list[dict[str, str]]
    ids: list[int]
    prompt_length: int
    generated: list[bool] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    turn_rewards: list[tuple[int, float]] = field(default_factory=list)  # (position of the turn's last token, r)
    finish_reason: str = "stop"
    metadata: dict[str, Any] = field(default_factory=dict)
    turns: int = 0
    live: bool = True

    def append(self, token_ids: Sequence[int], generated: bool, logprobs: Optional[Sequence[float]] = None) -> None:
        self.ids += token_ids
        self.generated += [generated] * len(token_ids)
        self.logprobs += list(logprobs) if logprobs is not None else [0.0] * len(token_ids)


def conversations(generator: Generator, tokenizer: Any, env: Environment, rows: Sequence[dict[str, Any]],
                  sampling: SamplingSettings, policy_version: int, settings: RolloutSettings) -> Trajectories:
    """``len(rows)`` prompts x ``settings.num_generations`` conversations played with ``env`` -> scored
    Trajectories (``rewards`` [B], ``turn_rewards`` [B, T], ``loss_mask`` True on generated tokens only).

    ``settings.max_turns`` (default ``env.max_turns``) caps the assistant turns; ``settings.max_total_tokens``
    the tokens of a conversation (prompt, turns and environment messages). Raises ``RewardError`` when more than
    ``settings.max_failure_fraction`` of the conversations had an environment failure (as the score stage does)."""
    if settings.max_total_tokens is None:
        raise ValueError("conversations need RolloutSettings.max_total_tokens (the engine's length, "
                         "policy.max_model_len)")
    num_generations, max_total_tokens, prompt_key = (settings.num_generations, settings.max_total_tokens,
                                                     settings.prompt_key)
    max_turns = settings.max_turns if settings.max_turns is not None else getattr(env, "max_turns", 1)
    head = [{"role": "system", "content": settings.system_prompt}] if settings.system_prompt is not None else []
    tools = rollout_tools(env, settings)  # every template call of the rollout renders them
    texts = render_prompt_texts(tokenizer, [r[prompt_key] for r in rows], settings.system_prompt, tools,
                                settings.chat_template_kwargs)
    prompt_ids = [tokenizer(t, add_special_tokens=False)["input_ids"] for t in texts]
    games = [_Conversation(i // num_generations, head + [{"role": "user", "content": rows[i // num_generations][prompt_key]}],
                           list(prompt_ids[i // num_generations]), len(prompt_ids[i // num_generations]))
             for i in range(len(rows) * num_generations)]
    errors: list[str] = []
    for turn in range(max_turns):
        live = [c for c in games if c.live]
        if not live:
            break
        if turn == 0:
            _take(games, generator.generate([list(p) for p in prompt_ids], num_generations, sampling))
        else:
            seed = None if sampling.seed is None else sampling.seed + TURN_SEED_STRIDE * turn
            _generate_turn(generator, live, replace(sampling, seed=seed), max_total_tokens)
        live = [c for c in live if c.live]  # a turn with no room left ended its conversation
        _env_step(env, live, games, rows, tokenizer, max_total_tokens, turn == max_turns - 1, errors, tools,
                  settings.chat_template_kwargs)
    batch = _as_trajectories(games, texts, rows, num_generations, policy_version, tokenizer, errors)
    check_reward_failures(errors, batch, env.name, settings.max_failure_fraction)
    turns = torch.tensor([float(c.turns) for c in games])
    env_tokens = (batch.attention_mask & ~batch.loss_mask).sum(1).float() - torch.tensor([float(c.prompt_length) for c in games])
    info = {"sampling_seed": sampling.seed,
            "rollout/turns_mean": float(turns.mean()), "rollout/env_tokens_mean": float(env_tokens.mean()),
            "reward_errors": len(errors)}
    return batch.with_(info=info)


def _take(conversations: Sequence[_Conversation], generation: Generation) -> None:
    """Append each sample of ``generation`` to its conversation as an assistant turn."""
    for conversation, ids, lps, text, reason in zip(conversations, generation.token_ids, generation.logprobs,
                                                   generation.texts, generation.finish_reasons):
        conversation.append(list(ids), True, lps)
        conversation.messages.append({"role": "assistant", "content": text})
        conversation.finish_reason = reason
        conversation.turns += 1


def _generate_turn(generator: Generator, live: list[_Conversation], sampling: SamplingSettings, budget: int) -> None:
    """One more assistant turn of each live conversation, grouped by the token limit its room allows."""
    by_limit: dict[int, list[_Conversation]] = {}
    for conversation in live:
        room = min(sampling.max_new_tokens, budget - len(conversation.ids))
        if room < 1:
            conversation.live, conversation.finish_reason = False, "length"
        else:
            by_limit.setdefault(room, []).append(conversation)
    for call, (limit, group) in enumerate(sorted(by_limit.items())):
        seed = None if sampling.seed is None else sampling.seed + call * len(live)
        _take(group, generator.generate([c.ids for c in group], 1, replace(sampling, max_new_tokens=limit, seed=seed)))


def _env_step(env: Environment, live: list[_Conversation], games: list[_Conversation], rows: Sequence[dict],
              tokenizer: Any, budget: int, last_turn: bool, errors: list[str],
              tools: Optional[Sequence[dict[str, Any]]], template_kwargs: Optional[dict[str, Any]]) -> None:
    """``env.step`` over the live conversations: rewards on each turn's last token, messages appended as tokens
    (rendered with the rollout's JSON ``tools`` and ``template_kwargs``, as the prompt was)."""
    if not live:
        return
    index = {id(c): i for i, c in enumerate(games)}
    result, failed = _step_each_alone_if_needed(env, live, rows, index)
    for message in result.errors + failed:  # the environment numbers the live conversations; the batch all of them
        local = error_sample_index(message)
        errors.append(message if local is None or message in failed else
                      message.replace(f"sample {local}: ", f"sample {index[id(live[local])]}: ", 1))
    too_long: list[tuple[int, int]] = []  # (characters or tokens of the message, tokens of room) of those cut
    for conversation, reward, done, observation, metadata in zip(live, result.rewards.tolist(), result.done.tolist(),
                                                                 result.observations, result.metadata):
        conversation.turn_rewards.append((len(conversation.ids) - 1, float(reward)))
        conversation.metadata = dict(metadata)
        if done or last_turn:
            conversation.live = False
            continue
        messages = observation if isinstance(observation, list) else [observation]
        for message in messages or [observation]:
            _check_message(env, message, index[id(conversation)])
        room = budget - len(conversation.ids) - 1  # the messages and one generated token must fit
        chars = sum(len(m["content"]) for m in messages)
        fits_in_chars = chars <= room * max_token_chars(tokenizer)  # if not, too long without tokenizing it
        message_ids = (appended_message_ids(tokenizer, conversation.messages, messages, conversation.ids[-1],
                                            tools, template_kwargs) if fits_in_chars else None)
        if message_ids is None or len(message_ids) > room:
            conversation.live, conversation.finish_reason = False, "length"
            too_long.append((chars, room))
            continue
        conversation.append(message_ids, False)
        conversation.messages.extend(messages)
    if too_long:
        chars, room = max(too_long)
        warnings.warn(f"environment {env.name!r}: {len(too_long)} message(s) did not fit in their conversation's "
                      f"{budget}-token budget (policy.max_total_sequence_length), so those conversations ended there "
                      f"(finish reason 'length'); the longest was {chars} characters with {max(room, 0)} tokens left. "
                      "Fix: shorten the environment's messages (e.g. cut tool output to a few thousand characters), "
                      "or raise policy.max_total_sequence_length", UserWarning, stacklevel=4)


def _step_each_alone_if_needed(env: Environment, live: list[_Conversation], rows: Sequence[dict],
                               index: dict[int, int]) -> tuple[EnvReturn, list[str]]:
    """``env.step`` over ``live``; if it raises, each conversation is stepped alone, and one whose step raises ends
    with reward 0 and a message (numbered in the batch) in the returned list, so one conversation's exception costs
    that conversation, not the step (the single-turn score stage contains a sample's failure the same way)."""
    conversations_, rows_ = [list(c.messages) for c in live], [rows[c.rows_index] for c in live]
    try:
        return env.step(conversations_, rows_), []
    except Exception:  # noqa: BLE001 - which conversation broke it? Ask one at a time
        pass
    steps, env_errors, failed = [], [], []  # steps: (reward, done, observation, metadata) per conversation
    for local, (conversation, row) in enumerate(zip(conversations_, rows_)):
        try:
            one = env.step([conversation], [row])
        except Exception as exc:  # noqa: BLE001 - contained to this conversation by design
            failed.append(f"{env.name}: {sample_error(index[id(live[local])], exc)}")
            steps.append((0.0, True, None, {"failed": True}))
            continue
        steps.append((float(one.rewards[0]), bool(one.done[0]), one.observations[0], one.metadata[0]))
        env_errors += [m.replace("sample 0: ", f"sample {local}: ", 1) for m in one.errors]
    rewards, done, observations, metadata = zip(*steps)
    return EnvReturn(torch.tensor(rewards, dtype=torch.float32), torch.tensor(done, dtype=torch.bool),
                     list(observations), list(metadata), env_errors), failed


def _check_message(env: Environment, message: Any, sample: int) -> None:
    """Refuse a next message the chat template cannot render (not a dict with text ``role`` and ``content``)."""
    if isinstance(message, dict) and isinstance(message.get("role"), str) and isinstance(message.get("content"), str):
        return
    what = (f"a {type(message).__name__}" if not isinstance(message, dict) else
            f"a message whose content is a {type(message.get('content')).__name__}"
            if isinstance(message.get("role"), str) else "a message without a text role")
    shown = repr(message)
    shown = shown if len(shown) <= 120 else shown[:120] + "..."
    raise RewardError(
        f"environment {env.name!r} answered sample {sample} with {what}, not text: {shown}; a conversation's messages "
        "are rendered by the chat template, which takes text only. Fix: have "
        f"{type(env).__name__}.step return each next message as {{'role': 'user' or 'tool', 'content': <str>}} "
        "(e.g. json.dumps(value) for structured output)")


def _as_trajectories(games: list[_Conversation], texts: list[str], rows: Sequence[dict], g: int, policy_version: int,
                     tokenizer: Any, errors: list[str]) -> Trajectories:
    b, t = len(games), max(len(c.ids) for c in games)
    pad = tokenizer.pad_token_id
    input_ids = torch.tensor([c.ids + [pad] * (t - len(c.ids)) for c in games], dtype=torch.long)
    loss_mask = torch.tensor([[False] * c.prompt_length + c.generated + [False] * (t - len(c.ids)) for c in games],
                             dtype=torch.bool)
    logprobs = torch.tensor([[0.0] * c.prompt_length + c.logprobs + [0.0] * (t - len(c.ids)) for c in games])
    attention_mask = torch.arange(t) < torch.tensor([len(c.ids) for c in games]).unsqueeze(1)
    turn_rewards = torch.zeros(b, t)
    for i, c in enumerate(games):
        for position, reward in c.turn_rewards:
            turn_rewards[i, position] += reward
    completions = tuple(tokenizer.decode(c.ids[c.prompt_length:], skip_special_tokens=False) for c in games)
    metadata = tuple(dict(c.metadata, turns=c.turns, turn_rewards=[r for _, r in c.turn_rewards]) for c in games)
    return Trajectories(
        prompts=tuple(texts[i // g] for i in range(b)), completions=completions, input_ids=input_ids,
        attention_mask=attention_mask, loss_mask=loss_mask, generator_logprobs=logprobs,
        finish_reasons=tuple(c.finish_reason for c in games), group_size=g, policy_version=policy_version,
        rows=tuple(rows), rewards=turn_rewards.sum(1), turn_rewards=turn_rewards, reward_errors=tuple(errors),
        env_metadata=metadata, tokenizer=tokenizer,
    )
