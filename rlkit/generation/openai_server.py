"""An OpenAI-compatible chat endpoint over rlkit's engine, recording every episode's exact tokens.

Agent code written against the OpenAI client (``openai.OpenAI(base_url=...)``, chat completions with ``tools``
and ``n``) drives the in-process engine through :class:`OpenAIEndpoint`: a FastAPI app served by uvicorn in a
background thread, bound to 127.0.0.1 on a free port. Each episode gets its own base URL
(:meth:`OpenAIEndpoint.episode_url`), so requests are recorded per episode with no header of rlkit's in the
agent's code; :attr:`OpenAIEndpoint.base_url` is the plain one (a notebook cell chatting with the policy).

**Exact tokens.** A request whose messages continue an earlier response of the same episode (its messages, the
assistant message as returned, then new messages) is not re-rendered: its ids are the earlier request's prompt ids
and *sampled* ids, then the new messages rendered by the chat template and appended as ids
(:func:`rlkit.data.chat.appended_message_ids`, as the multi-turn rollout does). So the recorded sequence is the
one the engine sampled from, the generator's logprob is kept for each sampled token, and which tokens the policy
produced is known exactly (:class:`Branch`). A request that continues nothing is rendered whole.

**Responses.** The sampled text is parsed for tool calls in ``call_format`` (Hermes/Qwen by default,
:mod:`rlkit.envs.tool_calls`): calls come back as OpenAI ``tool_calls`` (finish reason ``tool_calls``), the rest
as ``content``. A request the endpoint cannot serve (a bad tool schema, a message that is not text, an unknown
field type) is answered with an OpenAI-style error body (``{"error": {"message", "type":
"invalid_request_error", "param", "code"}}``, HTTP 400), which the client raises as ``BadRequestError``.

**Batching.** Concurrent requests (an agent's episodes run together) are collected and sampled in one engine call
per distinct (temperature, top_p, max tokens), from one background thread: the engine has one user at a time.

Deliberate simplifications: no streaming; ``logprobs`` are recorded, not returned; the sampling seed of a call is
the endpoint's seed plus a call counter (reproducible for a fixed order of arrival only); a request's ``n``
samples are independent continuations, and an episode's row is its last recorded sample's
branch (:meth:`Episode.final`).
"""

from __future__ import annotations

import asyncio
import json
import socket
import threading
import time
from dataclasses import dataclass, field, replace
from typing import Any, Literal, Mapping, Optional

import jsonschema
from pydantic import BaseModel, ConfigDict, Field

from rlkit.data.chat import apply_template, appended_message_ids
from rlkit.envs.tool_calls import ToolCallFormat, content_without_calls, parse_tool_calls
from rlkit.generation.base import Generator, SamplingSettings

BATCH_WAIT_S = 0.02  # how long the batcher waits for more concurrent requests before one engine call


class FunctionSpec(BaseModel):
    name: str = Field(pattern=r"^[A-Za-z0-9_-]{1,64}$")
    description: str = ""
    parameters: dict[str, Any] = Field(default_factory=lambda: {"type": "object", "properties": {}})


class ToolSpec(BaseModel):
    type: Literal["function"]
    function: FunctionSpec


class ChatRequest(BaseModel):
    """The fields of OpenAI's chat-completions request rlkit serves; others (``stream_options``...) are ignored."""

    model_config = ConfigDict(extra="ignore")
    model: str = "rlkit-policy"
    messages: list[dict[str, Any]] = Field(min_length=1)
    tools: Optional[list[ToolSpec]] = None
    n: int = Field(1, ge=1, le=64)
    temperature: Optional[float] = Field(None, ge=0, le=2)
    top_p: Optional[float] = Field(None, gt=0, le=1)
    max_tokens: Optional[int] = Field(None, ge=1)
    max_completion_tokens: Optional[int] = Field(None, ge=1)


class RequestError(ValueError):
    """A request the endpoint refuses, with the field it names (OpenAI's ``param``)."""

    def __init__(self, message: str, param: Optional[str] = None):
        super().__init__(message)
        self.param = param


def error_body(message: str, param: Optional[str] = None) -> dict[str, Any]:
    return {"error": {"message": message, "type": "invalid_request_error", "param": param, "code": None}}


def _key(message: Mapping[str, Any]) -> tuple:
    """What identifies a message when a client sends it back: role, text, and tool calls by name and arguments."""
    calls = []
    for call in message.get("tool_calls") or ():
        fn = call.get("function", call)
        arguments = fn.get("arguments")
        calls.append((fn.get("name"), json.loads(arguments) if isinstance(arguments, str) else arguments))
    return message.get("role"), message.get("content") or "", json.dumps(calls, sort_keys=True)


@dataclass
class Branch:
    """One sampled continuation: the conversation's ids, which ones the policy produced and their logprobs."""

    keys: list[tuple]  # the messages as the client sees them, by _key, the sampled response included
    template_messages: list[dict[str, Any]]  # the messages as rendered (the response as its raw text)
    ids: list[int]
    generated: list[bool]
    logprobs: list[float]  # the generator's, 0.0 where not generated
    prompt_length: int  # ids before the episode's first sampled token
    finish_reason: str = "stop"


@dataclass
class Episode:
    """Every response of one episode, in order of arrival."""

    branches: list[Branch] = field(default_factory=list)
    requests: int = 0

    def final(self) -> Branch:
        """The branch the episode ended on: the last sample recorded (of its last request)."""
        if not self.branches:
            raise ValueError("the episode made no request to the endpoint")
        return self.branches[-1]


@dataclass
class _Pending:
    prompt_ids: list[int]
    base: Optional[Branch]  # the branch this request continues (None: rendered whole)
    template_messages: list[dict[str, Any]]
    keys: list[tuple]
    n: int
    sampling: SamplingSettings
    future: asyncio.Future
    episode: str


class OpenAIEndpoint:
    """``with OpenAIEndpoint(generator, tokenizer) as endpoint:`` point an OpenAI client at ``endpoint.base_url``
    or at ``endpoint.episode_url(name)``; ``endpoint.episodes[name]`` holds what was sampled."""

    def __init__(self, generator: Generator, tokenizer: Any, sampling: SamplingSettings = SamplingSettings(),
                 max_model_len: Optional[int] = None, call_format: ToolCallFormat = "hermes",
                 template_kwargs: Optional[Mapping[str, Any]] = None, model_name: str = "rlkit-policy"):
        self.generator, self.tokenizer, self.sampling = generator, tokenizer, sampling
        self.max_model_len, self.call_format, self.model_name = max_model_len, call_format, model_name
        self.template_kwargs = dict(template_kwargs or {})
        self.episodes: dict[str, Episode] = {}
        self.port: Optional[int] = None
        self._server: Any = None
        self._thread: Optional[threading.Thread] = None
        self._lock = threading.Lock()  # episodes are written by the server's thread, read by the caller's
        self._calls = 0

    # ---- lifecycle ---------------------------------------------------------------------------------------
    def start(self) -> "OpenAIEndpoint":
        import uvicorn

        if self._thread is not None:
            return self
        with socket.socket() as probe:  # a free port on the loopback interface only
            probe.bind(("127.0.0.1", 0))
            self.port = probe.getsockname()[1]
        config = uvicorn.Config(self.app(), host="127.0.0.1", port=self.port, log_level="warning", lifespan="off")
        self._server = uvicorn.Server(config)
        self._thread = threading.Thread(target=self._server.run, daemon=True, name="rlkit-openai-endpoint")
        self._thread.start()
        deadline = time.monotonic() + 30
        while not self._server.started:
            if not self._thread.is_alive() or time.monotonic() > deadline:
                raise RuntimeError(f"the OpenAI endpoint did not start on 127.0.0.1:{self.port}")
            time.sleep(0.01)
        return self

    def close(self) -> None:
        if self._server is not None:
            self._server.should_exit = True
            self._thread.join(timeout=10)
        self._server, self._thread = None, None

    def __enter__(self) -> "OpenAIEndpoint":
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.close()

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.port}/v1"

    def episode_url(self, episode: str) -> str:
        """The base URL whose requests are recorded as ``episode``."""
        return f"http://127.0.0.1:{self.port}/episodes/{episode}/v1"

    def __repr__(self) -> str:
        where = self.base_url if self.port is not None and self._server is not None else "stopped"
        return f"OpenAIEndpoint({where}, {len(self.episodes)} episodes, call_format={self.call_format!r})"

    # ---- the app ---------------------------------------------------------------------------------------
    def app(self) -> Any:
        from fastapi import FastAPI, Request
        from fastapi.exceptions import RequestValidationError
        from fastapi.responses import JSONResponse

        app = FastAPI(title="rlkit OpenAI-compatible endpoint")
        queue: list[_Pending] = []
        state: dict[str, Any] = {"worker": None}

        @app.exception_handler(RequestValidationError)
        async def invalid(_: Request, exc: RequestValidationError) -> JSONResponse:
            first = exc.errors()[0]
            param = ".".join(str(p) for p in first.get("loc", ())[1:]) or None
            return JSONResponse(error_body(f"{param}: {first.get('msg')}" if param else str(first.get("msg")), param),
                                status_code=400)

        @app.get("/v1/models")
        @app.get("/episodes/{episode}/v1/models")
        async def models(episode: str = "") -> dict[str, Any]:
            return {"object": "list", "data": [{"id": self.model_name, "object": "model", "owned_by": "rlkit"}]}

        async def complete(request: ChatRequest, episode: str) -> Any:
            try:
                pending = self._prepare(request, episode, asyncio.get_running_loop().create_future())
            except RequestError as exc:
                return JSONResponse(error_body(str(exc), exc.param), status_code=400)
            except Exception as exc:  # noqa: BLE001 - the template cannot render these messages: the request's fault
                return JSONResponse(error_body(f"the chat template cannot render these messages: "
                                               f"{type(exc).__name__}: {exc}", "messages"), status_code=400)
            queue.append(pending)
            if state["worker"] is None or state["worker"].done():
                state["worker"] = asyncio.create_task(self._drain(queue))
            return await pending.future

        @app.post("/v1/chat/completions")
        async def chat(request: ChatRequest) -> Any:
            return await complete(request, "default")

        @app.post("/episodes/{episode}/v1/chat/completions")
        async def chat_in_episode(episode: str, request: ChatRequest) -> Any:
            return await complete(request, episode)

        return app

    # ---- requests ----------------------------------------------------------------------------------------
    def _prepare(self, request: ChatRequest, episode: str, future: asyncio.Future) -> _Pending:
        tools = [t.model_dump() for t in request.tools] if request.tools else None
        for i, tool in enumerate(tools or ()):
            try:
                jsonschema.Draft202012Validator.check_schema(tool["function"]["parameters"])
            except jsonschema.SchemaError as exc:
                raise RequestError(f"tools[{i}].function.parameters is not a valid JSON schema: {exc.message}",
                                   f"tools[{i}].function.parameters") from None
        for i, message in enumerate(request.messages):
            if not isinstance(message.get("role"), str):
                raise RequestError(f"messages[{i}] has no role", f"messages[{i}].role")
            if message.get("content") is not None and not isinstance(message["content"], str):
                raise RequestError(f"messages[{i}].content must be text (content parts are not served)",
                                   f"messages[{i}].content")
        keys = [_key(m) for m in request.messages]
        with self._lock:
            record = self.episodes.setdefault(episode, Episode())
            record.requests += 1
            base = max((b for b in record.branches if keys[:len(b.keys)] == b.keys and len(keys) > len(b.keys)),
                       key=lambda b: len(b.keys), default=None)
        if base is not None:
            new = [self._renderable(m) for m in request.messages[len(base.keys):]]
            ids = base.ids + appended_message_ids(self.tokenizer, base.template_messages, new, base.ids[-1], tools,
                                                  self.template_kwargs)
            template_messages = base.template_messages + new
        else:
            template_messages = [self._renderable(m) for m in request.messages]
            text = apply_template(self.tokenizer, template_messages, True, tools, self.template_kwargs)
            ids = self.tokenizer(text, add_special_tokens=False)["input_ids"]
        limit = request.max_completion_tokens or request.max_tokens or self.sampling.max_new_tokens
        if self.max_model_len is not None:
            if len(ids) >= self.max_model_len:
                raise RequestError(f"the conversation is {len(ids)} tokens, the engine's limit {self.max_model_len}",
                                   "messages")
            limit = min(limit, self.max_model_len - len(ids))
        sampling = replace(self.sampling, max_new_tokens=limit,
                           temperature=self.sampling.temperature if request.temperature is None else request.temperature,
                           top_p=self.sampling.top_p if request.top_p is None else request.top_p)
        return _Pending(ids, base, template_messages, keys, request.n, sampling, future, episode)

    @staticmethod
    def _renderable(message: dict[str, Any]) -> dict[str, Any]:
        """A client's message as the template takes it (``content`` text, tool calls' arguments as objects)."""
        out = {k: v for k, v in message.items() if v is not None}
        out["content"] = message.get("content") or ""
        if message.get("tool_calls"):
            out["tool_calls"] = [{"type": "function", "function": {
                "name": c["function"]["name"], "arguments": json.loads(c["function"]["arguments"])
                if isinstance(c["function"]["arguments"], str) else c["function"]["arguments"]}}
                for c in message["tool_calls"]]
        return out

    async def _drain(self, queue: list[_Pending]) -> None:
        """Serve what is queued, a batch at a time, until the queue is empty."""
        while queue:
            await asyncio.sleep(BATCH_WAIT_S)
            batch = list(queue)
            del queue[:len(batch)]
            groups: dict[tuple, list[_Pending]] = {}
            for p in batch:
                groups.setdefault((p.sampling.temperature, p.sampling.top_p, p.sampling.max_new_tokens), []).append(p)
            for group in groups.values():
                try:
                    responses = await asyncio.to_thread(self._sample, group)
                except Exception as exc:  # noqa: BLE001 - the engine failed: every request of the call gets it
                    for p in group:
                        p.future.set_exception(exc)
                    continue
                for p, response in zip(group, responses):
                    p.future.set_result(response)

    def _sample(self, group: list[_Pending]) -> list[dict[str, Any]]:
        """One engine call for ``group`` (each request's prompt repeated ``n`` times), recorded and answered."""
        prompts = [p.prompt_ids for p in group for _ in range(p.n)]
        with self._lock:
            self._calls += 1
            seed = None if self.sampling.seed is None else self.sampling.seed + self._calls
        generation = self.generator.generate(prompts, 1, replace(group[0].sampling, seed=seed))
        out, at = [], 0
        for p in group:
            choices, usage = [], 0
            for c in range(p.n):
                ids, lps = list(generation.token_ids[at]), list(generation.logprobs[at])
                text, reason = generation.texts[at], generation.finish_reasons[at]
                at += 1
                usage += len(ids)
                choices.append(self._record(p, c, ids, lps, text, reason))
            out.append({"id": f"chatcmpl-{p.episode}-{self._calls}", "object": "chat.completion",
                        "created": int(time.time()), "model": self.model_name, "choices": choices,
                        "usage": {"prompt_tokens": len(p.prompt_ids), "completion_tokens": usage,
                                  "total_tokens": len(p.prompt_ids) * p.n + usage}})
        return out

    def _record(self, p: _Pending, index: int, ids: list[int], lps: list[float], text: str, reason: str) -> dict[str, Any]:
        parsed = parse_tool_calls(text, self.call_format)
        calls = [c.as_openai(i) for i, c in enumerate(parsed.calls)]
        message = {"role": "assistant", "content": content_without_calls(text, self.call_format) if calls else text}
        if calls:
            message["tool_calls"] = calls
        base = p.base
        prompt_new = len(p.prompt_ids) - (len(base.ids) if base else 0)
        branch = Branch(
            keys=p.keys + [_key(message)],
            template_messages=p.template_messages + [{"role": "assistant", "content": text}],
            ids=list(p.prompt_ids) + ids,
            generated=(base.generated if base else []) + [False] * prompt_new + [True] * len(ids),
            logprobs=(base.logprobs if base else []) + [0.0] * prompt_new + lps,
            prompt_length=base.prompt_length if base else len(p.prompt_ids),
            finish_reason=reason,
        )
        with self._lock:
            self.episodes[p.episode].branches.append(branch)
        finish = "tool_calls" if calls else ("length" if reason == "length" else "stop")
        return {"index": index, "message": message, "finish_reason": finish, "logprobs": None}
