"""Tools a policy can call, and the text format of a call.

**Call format.** A tool call is one block ``<NAME>INPUT</NAME>`` in the assistant's message, where ``NAME`` is a
tool's name: ``<calc>1234*5678</calc>``, ``<python>print(sum(range(10)))</python>``. The first block of a
known tool in the message is the call; text around it is ignored. A message without one is a final answer.
Short tags keep the calls few tokens long for character-level tiny models; a real model is taught the format
by a system prompt or an SFT warm start.

**Results.** A tool returns text. Whatever goes wrong (the tool raises, hangs, prints megabytes or returns
something that is not text) the model gets a short ``error: ...`` observation of at most
``MAX_OBSERVATION_CHARS`` characters, never an exception: one bad call must not stop a batch.

Shipped tools: :class:`Calculator` (integer and float arithmetic, parsed with ``ast``, never ``eval``),
:class:`PythonTool` (a separate process in a kernel sandbox, :mod:`rlkit.sandbox`), and :class:`FunctionTool`,
which wraps any ``str -> str`` function with a wall-clock timeout.

Deliberate simplifications: one call per assistant message; no JSON arguments (the input is the block's text).
A :class:`FunctionTool` runs in a thread of this process: on timeout its result is abandoned, but the thread
cannot be killed; run code that may not return in :class:`PythonTool` instead.
"""

from __future__ import annotations

import ast
import operator
import re
import threading
from abc import ABC, abstractmethod
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Callable, Optional, Sequence

from rlkit.sandbox.kernel import SandboxMode
from rlkit.sandbox.run import SandboxLimits, resolve_backend, run_in

MAX_OBSERVATION_CHARS = 200  # of a tool's result or error shown to the model


class Tool(ABC):
    """A named ``str -> str`` action. ``run`` may raise; :func:`run_tool` turns that into an error text."""

    name: str
    timeout_seconds: float = 2.0  # run_tool stops waiting after this

    @abstractmethod
    def run(self, text: str) -> str:
        """The result of calling the tool on ``text`` (the block's content)."""

    def __repr__(self) -> str:
        return f"{type(self).__name__}(name={self.name!r})"


class Calculator(Tool):
    """``+ - * / // % **`` and parentheses over integers and floats; exponents at most 64, numbers at most
    ``max_digits`` digits long. ``"12*(3+4)"`` -> ``"84"``."""

    name = "calc"
    _OPS = {ast.Add: operator.add, ast.Sub: operator.sub, ast.Mult: operator.mul, ast.Div: operator.truediv,
            ast.FloorDiv: operator.floordiv, ast.Mod: operator.mod, ast.Pow: operator.pow}

    def __init__(self, max_digits: int = 100):
        self.max_digits = max_digits

    def run(self, text: str) -> str:
        tree = ast.parse(text.strip(), mode="eval")
        value = self._eval(tree.body)
        if isinstance(value, float) and value.is_integer() and abs(value) < 1e15:
            value = int(value)
        return str(value)

    def _eval(self, node: ast.AST) -> Any:
        if isinstance(node, ast.Constant) and type(node.value) in (int, float):
            if len(str(abs(node.value))) > self.max_digits:
                raise ValueError(f"number has more than {self.max_digits} digits")
            return node.value
        if isinstance(node, ast.UnaryOp) and isinstance(node.op, (ast.USub, ast.UAdd)):
            value = self._eval(node.operand)
            return -value if isinstance(node.op, ast.USub) else value
        if isinstance(node, ast.BinOp) and type(node.op) in self._OPS:
            left, right = self._eval(node.left), self._eval(node.right)
            if isinstance(node.op, ast.Pow) and abs(right) > 64:
                raise ValueError(f"exponent {right} is too large (at most 64)")
            value = self._OPS[type(node.op)](left, right)
            if isinstance(value, int) and len(str(abs(value))) > self.max_digits:
                raise ValueError(f"result has more than {self.max_digits} digits")
            return value
        raise ValueError(f"not arithmetic: {ast.unparse(node)!r}")


class PythonTool(Tool):
    """Runs the block as a Python program in the kernel sandbox of :mod:`rlkit.sandbox.run`; the result is what it
    prints. ``sandbox``: ``"auto"`` (bwrap, else unshare), a backend by name, or
    ``"unsafe-process"``. Made where no kernel sandbox works, it raises :class:`SandboxUnavailableError` with the
    cause and the fix, unless ``sandbox="unsafe-process"`` (a warning names what is then lost)."""

    name = "python"

    def __init__(self, limits: SandboxLimits = SandboxLimits(), sandbox: SandboxMode = "auto"):
        self.limits = limits
        self.backend = resolve_backend(sandbox)  # refuse now, at build time, not on the first call
        # the sandbox enforces its limits itself (teardown included); this outer bound only catches a sandbox
        # that does not return
        self.timeout_seconds = limits.startup_seconds + limits.wall_seconds + 10.0

    def run(self, text: str) -> str:
        result = run_in(self.backend, text, self.limits)
        if result.ok:
            return result.output
        last = result.output.strip().splitlines()[-1] if result.output.strip() else ""
        raise RuntimeError(f"{result.reason}" + (f": {last}" if last else ""))

    def __repr__(self) -> str:
        return f"{type(self).__name__}(name={self.name!r}, backend={self.backend!r})"


class FunctionTool(Tool):
    """Any ``fn(text) -> str`` as a tool called ``name``."""

    def __init__(self, name: str, fn: Callable[[str], Any], timeout_seconds: float = 2.0):
        self.name, self.fn, self.timeout_seconds = name, fn, timeout_seconds

    def run(self, text: str) -> Any:
        return self.fn(text)


def parse_tool_call(text: str, names: Sequence[str]) -> Optional[tuple[str, str]]:
    """``(name, input)`` of the first call in ``text`` to a tool in ``names`` (``<name>input</name>``, the input
    may span lines), or None for a final answer."""
    alternatives = "|".join(re.escape(n) for n in names)
    match = re.search(rf"<({alternatives})>(.*?)</\1>", text, re.DOTALL)
    return (match.group(1), match.group(2)) if match else None


def bounded(text: str, max_chars: int = MAX_OBSERVATION_CHARS) -> str:
    return text if len(text) <= max_chars else text[:max_chars] + "... [truncated]"


def run_tool(tool: Tool, text: str) -> tuple[str, bool]:
    """``(observation, ok)``: the tool's result, or a short ``error: ...`` when it raised, timed out or returned
    something that is not a string; at most ``MAX_OBSERVATION_CHARS`` (plus a truncation mark) either way."""
    box: dict[str, Any] = {}

    def call() -> None:
        try:
            box["value"] = tool.run(text)
        except BaseException as exc:  # noqa: BLE001 - a tool's failure is the model's observation
            box["error"] = exc

    worker = threading.Thread(target=call, daemon=True, name=f"rlkit-tool-{tool.name}")
    worker.start()
    worker.join(tool.timeout_seconds)
    if worker.is_alive():
        return f"error: {tool.name} timed out after {tool.timeout_seconds:g} s", False
    if "error" in box:
        exc = box["error"]
        return bounded(f"error: {type(exc).__name__}: {exc}"), False
    value = box.get("value")
    if not isinstance(value, str):
        return bounded(f"error: {tool.name} returned {type(value).__name__}, not text"), False
    return bounded(value), True


def run_tools(calls: Sequence[tuple[Tool, str]], max_workers: int = 8) -> list[tuple[str, bool]]:
    """:func:`run_tool` of every call, concurrently: a batch with hanging calls waits about one timeout, not
    one per call."""
    if not calls:
        return []
    with ThreadPoolExecutor(max_workers=min(max_workers, len(calls)), thread_name_prefix="rlkit-tools") as pool:
        return list(pool.map(lambda call: run_tool(*call), calls))
