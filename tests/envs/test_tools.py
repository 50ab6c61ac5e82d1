"""Tools and the tool environment: results, bounded error observations, the Python tool refused without a
kernel sandbox (the sandbox itself: tests/sandbox/test_run.py)."""

import threading
import time

import pytest

from rlkit.envs.tool_env import ToolEnvironment
from rlkit.envs.tools import MAX_OBSERVATION_CHARS, Calculator, FunctionTool, PythonTool, parse_tool_call, run_tool
from rlkit.sandbox import SandboxLimits, SandboxUnavailableError, run_python
from rlkit.sandbox import run as sandbox_run

LIMIT = MAX_OBSERVATION_CHARS + len("... [truncated]")


def test_calls_are_parsed_from_the_documented_block_format():
    assert parse_tool_call("let me see <calc>12*(3+4)</calc> ok", ["calc", "python"]) == ("calc", "12*(3+4)")
    assert parse_tool_call("<python>print(1)\nprint(2)</python>", ["calc", "python"]) == ("python", "print(1)\nprint(2)")
    assert parse_tool_call("84", ["calc"]) is None
    assert parse_tool_call("<calc>1+1</python>", ["calc", "python"]) is None  # unmatched tags are an answer


@pytest.mark.parametrize("expression, result", [("12*(3+4)", "84"), ("7/2", "3.5"), ("-3**2", "-9"), ("8//3", "2"),
                                                ("12345678901*98765432109", str(12345678901 * 98765432109))])
def test_the_calculator_computes_arithmetic(expression, result):
    assert Calculator().run(expression) == result


@pytest.mark.parametrize("expression", ["__import__('os').system('ls')", "2**1000", "1/0", "x+1", "", "9" * 200])
def test_the_calculator_refuses_anything_else_with_a_short_error(expression):
    observation, ok = run_tool(Calculator(), expression)
    assert not ok and observation.startswith("error: ") and len(observation) <= LIMIT


def test_a_tool_that_raises_hangs_or_returns_garbage_gives_a_bounded_error():
    def raises(text):
        raise KeyError("x" * 10_000)

    hang = threading.Event()
    cases = {"raises": raises, "hangs": lambda text: hang.wait(30), "bytes": lambda text: b"\x00\xff",
             "none": lambda text: None, "huge": lambda text: "y" * 10**6}
    for name, fn in cases.items():
        t0 = time.perf_counter()
        observation, ok = run_tool(FunctionTool(name, fn, timeout_seconds=0.5), "input")
        assert time.perf_counter() - t0 < 2.0, name
        assert len(observation) <= LIMIT, name
        assert ok == (name == "huge"), name
        assert observation.startswith("error: ") or name == "huge", name
    hang.set()
    assert run_tool(FunctionTool("h", lambda t: "", 0.5), "")[0] == ""


def test_the_python_tool_is_refused_without_a_kernel_sandbox_unless_asked(monkeypatch):
    monkeypatch.setattr(sandbox_run, "backend_problem", lambda backend: "" if backend == "unsafe-process" else "no userns")
    with pytest.raises(SandboxUnavailableError, match=r"PythonTool\(sandbox='unsafe-process'\)"):
        PythonTool()
    refused = run_python("print(1)")  # never a silent downgrade: run_python refuses, it does not raise
    assert not refused.ok and refused.reason.startswith("refused: no kernel sandbox") and refused.output == ""
    sandbox_run._warn_unsafe.cache_clear()
    with pytest.warns(RuntimeWarning, match="Lost: the trainer and every process"):
        tool = PythonTool(sandbox="unsafe-process")
    assert tool.backend == "unsafe-process" and tool.run("print(6 * 7)") == "42\n"


def test_the_tool_environment_answers_calls_and_scores_answers():
    env = ToolEnvironment([Calculator(), PythonTool(SandboxLimits(wall_seconds=1.0))], max_turns=2)
    row = {"prompt": "1234+5678", "answer": "6912"}
    call = [{"role": "user", "content": "1234+5678"}, {"role": "assistant", "content": "<calc>1234+5678</calc>"}]
    answered = call + [{"role": "tool", "content": "6912"}, {"role": "assistant", "content": "6912"}]
    hang = [{"role": "user", "content": "q"}, {"role": "assistant", "content": "<python>while True: pass</python>"}]
    out_of_turns = answered[:-1] + [{"role": "assistant", "content": "<calc>1+1</calc>"}]
    result = env.step([call, answered, hang, out_of_turns], [row] * 4)
    assert result.done.tolist() == [False, True, False, True]
    assert result.rewards.tolist() == [0.0, 1.0, 0.0, 0.0]
    assert result.observations[0] == {"role": "tool", "content": "6912"}
    assert result.observations[2]["content"].startswith("error: ") and len(result.observations[2]["content"]) <= LIMIT
    assert result.metadata[1]["correct"] is True and result.metadata[0]["tool"] == "calc"
    assert result.metadata[2]["tool_ok"] is False and result.metadata[3]["tool"] == "calc"
    assert [m["tool_calls"] for m in result.metadata] == [1, 1, 1, 2]
