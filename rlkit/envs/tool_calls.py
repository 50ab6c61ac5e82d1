"""Native tool calls: tools declared as JSON schemas, calls parsed from the model's own format, results as
``tool`` messages.

A :class:`JsonTool` is declared once: a name, a JSON-schema ``parameters`` object and a Python callable taking
the arguments as keywords (or any :class:`rlkit.envs.tools.Tool`, e.g. the sandboxed :class:`PythonTool`, with
its text input as one string argument: :meth:`JsonTool.from_tool`). :meth:`JsonTool.schema` is the OpenAI
``{"type": "function", "function": {...}}`` dict that chat templates take as ``apply_chat_template(..., tools=)``.

Calls are parsed from the assistant's text in the format the model was trained to write (``TOOL_CALL_FORMATS``):

- ``hermes`` (Qwen2.5, Qwen3, Hermes): ``<tool_call>\\n{"name": ..., "arguments": {...}}\\n</tool_call>``, any
  number of blocks in one message;
- ``llama3`` (Llama 3.1-3.3 JSON tool calling): the message is ``{"name": ..., "parameters": {...}}``, optionally
  after ``<|python_tag|>``, several objects separated by ``;``.

Every call is answered: a malformed block (not JSON, no name, arguments not an object), an unknown tool, arguments
that fail the tool's schema (checked with ``jsonschema``), a tool that raises or hangs: each gives the model an
``error: ...`` observation of at most :data:`rlkit.envs.tools.MAX_OBSERVATION_CHARS` characters, never an
exception, as the text tools do. Results are :func:`tool_messages`, one ``tool`` message per call in order.

Why not vLLM's tool parsers: they look the markers up as single tokens of the vocabulary (the test BPE has none)
and answer a malformed call by returning the text as content, where RL needs an error observation.

Deliberate simplifications: a call's ``arguments`` given as a JSON string (some OpenAI-format writers do) is
decoded; text around the calls is ignored; the JSON schema is checked with Draft 2020-12.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from typing import Any, Callable, Literal, Optional, Sequence

import jsonschema

from rlkit.envs.tools import Tool, bounded, run_tools

_HERMES_BLOCK = re.compile(r"<tool_call>(.*?)(?:</tool_call>|$)", re.DOTALL)
_PYTHON_TAG = "<|python_tag|>"


@dataclass(frozen=True)
class ToolCall:
    """One parsed call: the tool's name and its arguments (a JSON object)."""

    name: str
    arguments: dict[str, Any]

    def as_openai(self, index: int) -> dict[str, Any]:
        """The call as an OpenAI ``tool_calls`` entry (``arguments`` a JSON string, ``id`` ``call_<index>``)."""
        return {"id": f"call_{index}", "type": "function",
                "function": {"name": self.name, "arguments": json.dumps(self.arguments)}}


@dataclass(frozen=True)
class ParsedCalls:
    """What :func:`parse_tool_calls` found: the well-formed calls and one message per malformed one."""

    calls: tuple[ToolCall, ...] = ()
    errors: tuple[str, ...] = ()

    def __bool__(self) -> bool:
        return bool(self.calls or self.errors)


@dataclass
class JsonTool:
    """A tool with JSON arguments: ``fn(**arguments)`` returns its result (text, or any JSON value, dumped)."""

    name: str
    fn: Callable[..., Any]
    parameters: dict[str, Any] = field(default_factory=lambda: {"type": "object", "properties": {}})
    description: str = ""
    timeout_seconds: float = 2.0

    def __post_init__(self) -> None:
        jsonschema.Draft202012Validator.check_schema(self.parameters)  # a bad schema is the author's bug: raise now

    @classmethod
    def from_tool(cls, tool: Tool, argument: str = "code", description: str = "") -> "JsonTool":
        """``tool`` (a text tool: :class:`PythonTool`, :class:`Calculator`...) with its input as the one string
        argument ``argument``, run with the tool's own timeout (the sandbox's limits for :class:`PythonTool`)."""
        return cls(tool.name, lambda **kw: tool.run(kw[argument]),
                   {"type": "object", "properties": {argument: {"type": "string"}}, "required": [argument]},
                   description, tool.timeout_seconds)

    def schema(self) -> dict[str, Any]:
        """The OpenAI tool declaration the chat template renders (``tools=[t.schema() for t in tools]``)."""
        function = {"name": self.name, "description": self.description, "parameters": self.parameters}
        return {"type": "function", "function": function if self.description else
                {k: v for k, v in function.items() if k != "description"}}


def _call_of(obj: Any, arguments_key: str) -> ToolCall:
    if not isinstance(obj, dict) or not isinstance(obj.get("name"), str):
        raise ValueError("a tool call is a JSON object with a string 'name'")
    arguments = obj.get(arguments_key, obj.get("arguments" if arguments_key != "arguments" else "parameters", {}))
    if isinstance(arguments, str):
        arguments = json.loads(arguments)
    if not isinstance(arguments, dict):
        raise ValueError(f"the arguments of {obj['name']!r} must be a JSON object, got {type(arguments).__name__}")
    return ToolCall(obj["name"], arguments)


def _malformed(exc: Exception) -> str:
    """The error observation of a call that is not a well-formed JSON call: short, since it is appended to a
    conversation with a token budget (the model has its own block in view; JSON's error without line and column)."""
    return bounded(f"error: malformed tool call: {getattr(exc, 'msg', None) or exc}", 100)


def _parse_hermes(text: str) -> ParsedCalls:
    calls, errors = [], []
    for match in _HERMES_BLOCK.finditer(text):
        block = match.group(1).strip()
        if not match.group(0).endswith("</tool_call>"):
            errors.append("error: unclosed <tool_call>")
            continue
        try:
            calls.append(_call_of(json.loads(block), "arguments"))
        except (ValueError, TypeError) as exc:  # json.JSONDecodeError is a ValueError
            errors.append(_malformed(exc))
    return ParsedCalls(tuple(calls), tuple(errors))


def _parse_llama3(text: str) -> ParsedCalls:
    body = text.strip()
    body = body[len(_PYTHON_TAG):].lstrip() if body.startswith(_PYTHON_TAG) else body
    if not body.startswith("{"):
        return ParsedCalls()
    calls, errors, decoder, at = [], [], json.JSONDecoder(), 0
    while at < len(body):
        try:
            obj, end = decoder.raw_decode(body, at)
            calls.append(_call_of(obj, "parameters"))
        except (ValueError, TypeError) as exc:
            errors.append(_malformed(exc))
            break
        at = end
        while at < len(body) and body[at] in " \t\r\n;":
            at += 1
    return ParsedCalls(tuple(calls), tuple(errors))


_PARSERS: dict[str, Callable[[str], ParsedCalls]] = {"hermes": _parse_hermes, "llama3": _parse_llama3}
TOOL_CALL_FORMATS: tuple[str, ...] = tuple(_PARSERS)
ToolCallFormat = Literal[TOOL_CALL_FORMATS]  # type: ignore[valid-type]


def parse_tool_calls(text: str, format: ToolCallFormat = "hermes") -> ParsedCalls:
    """The calls in an assistant message written in ``format``; an empty result is a final answer."""
    if format not in _PARSERS:
        raise ValueError(f"unknown tool-call format {format!r}; choose one of {TOOL_CALL_FORMATS}")
    return _PARSERS[format](text)


def content_without_calls(text: str, format: ToolCallFormat = "hermes") -> Optional[str]:
    """The text of a message around its calls (an OpenAI response's ``content`` next to ``tool_calls``), None
    when nothing is left."""
    rest = _HERMES_BLOCK.sub("", text) if format == "hermes" else ("" if parse_tool_calls(text, format) else text)
    return rest.strip() or None


class _Bound(Tool):
    """One call of a :class:`JsonTool` as a text tool, so :func:`run_tools` runs it (timeout, error text)."""

    def __init__(self, tool: JsonTool, arguments: dict[str, Any]):
        self.name, self.tool, self.arguments, self.timeout_seconds = tool.name, tool, arguments, tool.timeout_seconds

    def run(self, text: str) -> str:
        value = self.tool.fn(**self.arguments)
        return value if isinstance(value, str) else json.dumps(value)


def check_call(call: ToolCall, tools: dict[str, JsonTool]) -> Optional[str]:
    """Why ``call`` cannot run (an unknown tool, arguments against the schema), as an error text; None if it can."""
    if call.name not in tools:
        return f"error: unknown tool {call.name!r}; the tools are {sorted(tools)}"
    try:
        jsonschema.validate(call.arguments, tools[call.name].parameters)
    except jsonschema.ValidationError as exc:
        return bounded(f"error: invalid arguments for {call.name}: {exc.message}")
    return None


def tool_messages(parsed: Sequence[ParsedCalls], tools: Sequence[JsonTool]) -> list[list[dict[str, str]]]:
    """For each message's parsed calls, the ``tool`` messages answering them (malformed blocks first, then each
    call in order); every call of every message runs concurrently, each within its tool's timeout."""
    by_name = {t.name: t for t in tools}
    out: list[list[dict[str, str]]] = []
    runs: list[tuple[int, int, ToolCall]] = []  # (message, position in its answers, call)
    for m, found in enumerate(parsed):
        answers = [{"role": "tool", "content": e} for e in found.errors]
        for call in found.calls:
            problem = check_call(call, by_name)
            answers.append({"role": "tool", "name": call.name, "content": problem or ""})
            if problem is None:
                runs.append((m, len(answers) - 1, call))
        out.append(answers)
    results = run_tools([(_Bound(by_name[c.name], c.arguments), "") for _, _, c in runs])
    for (m, position, _), (text, _ok) in zip(runs, results):
        out[m][position]["content"] = text
    return out
