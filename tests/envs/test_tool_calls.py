"""Native JSON tool calls: parsing the Hermes/Qwen and Llama 3 formats, error observations, schema checks."""

import json
import time

import pytest
import torch

from rlkit.envs.native_tools import NativeToolEnvironment
from rlkit.envs.tool_arithmetic import NativeToolArithmeticEnvironment, add_tool, native_tool_demonstration
from rlkit.envs.tool_calls import JsonTool, ToolCall, parse_tool_calls, tool_messages
from rlkit.envs.tools import Calculator, MAX_OBSERVATION_CHARS
from rlkit.models.bpe import build_bpe_tokenizer


def hermes(name, arguments):
    return f"<tool_call>\n{json.dumps({'name': name, 'arguments': arguments})}\n</tool_call>"


def test_hermes_several_calls_in_one_message_in_order():
    text = "Let me add.\n" + hermes("add", {"a": 1, "b": 2}) + "\n" + hermes("mul", {"x": [1, 2]})
    parsed = parse_tool_calls(text, "hermes")
    assert parsed.calls == (ToolCall("add", {"a": 1, "b": 2}), ToolCall("mul", {"x": [1, 2]})) and not parsed.errors
    assert not parse_tool_calls("4821", "hermes")  # no call: a final answer


def test_hermes_malformed_blocks_are_errors_not_exceptions():
    text = ('<tool_call>\n{"name": "add", "arguments": {"a": 1,}}\n</tool_call>'  # trailing comma
            '<tool_call>\n{"arguments": {}}\n</tool_call>'  # no name
            '<tool_call>\n{"name": "add", "arguments": 3}\n</tool_call>'  # arguments not an object
            + hermes("add", {"a": 1, "b": 2}) + '<tool_call>\n{"name": "add"')  # unclosed
    parsed = parse_tool_calls(text, "hermes")
    assert parsed.calls == (ToolCall("add", {"a": 1, "b": 2}),)
    assert len(parsed.errors) == 4 and all(e.startswith("error: ") for e in parsed.errors)
    # short: appended to a conversation with a token budget
    assert parsed.errors[0] == "error: malformed tool call: Expecting property name enclosed in double quotes"
    assert parsed.errors[3] == "error: unclosed <tool_call>"


def test_llama3_json_calls_with_and_without_python_tag():
    one = parse_tool_calls('{"name": "add", "parameters": {"a": 1, "b": 2}}', "llama3")
    assert one.calls == (ToolCall("add", {"a": 1, "b": 2}),)
    two = parse_tool_calls('<|python_tag|>{"name": "a", "parameters": {}}; {"name": "b", "arguments": "{\\"x\\": 1}"}',
                           "llama3")
    assert two.calls == (ToolCall("a", {}), ToolCall("b", {"x": 1}))
    assert not parse_tool_calls("The answer is 3.", "llama3")
    bad = parse_tool_calls('{"name": "add", "parameters": {"a": 1', "llama3")
    assert not bad.calls and bad.errors[0].startswith("error: malformed tool call")
    with pytest.raises(ValueError, match="unknown tool-call format"):
        parse_tool_calls("x", "mistral")


def test_tool_messages_answer_every_call_with_a_result_or_an_error():
    slow = JsonTool("slow", lambda: time.sleep(5), timeout_seconds=0.2)
    boom = JsonTool("boom", lambda: 1 / 0)
    calc = JsonTool.from_tool(Calculator(), argument="expression")
    parsed = parse_tool_calls(hermes("add", {"a": 2, "b": 3}) + hermes("add", {"a": "2", "b": 3})
                              + hermes("nope", {}) + hermes("slow", {}) + hermes("boom", {})
                              + hermes("calc", {"expression": "6*7"}) + "<tool_call>{oops}</tool_call>", "hermes")
    t0 = time.perf_counter()
    [messages] = tool_messages([parsed], [add_tool(), slow, boom, calc])
    assert time.perf_counter() - t0 < 3  # one timeout, not one per call
    contents = [m["content"] for m in messages]
    assert [m["role"] for m in messages] == ["tool"] * 7
    assert contents[0].startswith("error: malformed tool call")
    assert contents[1] == "5"
    assert contents[2].startswith("error: invalid arguments for add: '2' is not of type 'integer'")
    assert contents[3].startswith("error: unknown tool 'nope'")
    assert contents[4] == "error: slow timed out after 0.2 s"
    assert contents[5].startswith("error: ZeroDivisionError")
    assert contents[6] == "42"
    assert all(len(c) <= MAX_OBSERVATION_CHARS + len("... [truncated]") for c in contents)


def test_a_bad_schema_is_refused_when_the_tool_is_declared():
    import jsonschema

    with pytest.raises(jsonschema.SchemaError):
        JsonTool("bad", lambda: "", {"type": "object", "properties": {"a": {"type": "integr"}}})


def test_native_environment_steps_calls_answers_and_turn_limit():
    env = NativeToolArithmeticEnvironment(max_turns=2)
    row = {"prompt": "4821+937", "answer": "5758"}
    call = hermes("add", {"a": 4821, "b": 937})
    convs = [[{"role": "user", "content": "4821+937"}, {"role": "assistant", "content": call + call}],
             [{"role": "user", "content": "4821+937"}, {"role": "assistant", "content": "5758"}],
             [{"role": "user", "content": "4821+937"}, {"role": "assistant", "content": "<tool_call>{</tool_call>"}],
             [{"role": "user", "content": "4821+937"}, {"role": "assistant", "content": call},
              {"role": "tool", "content": "5758"}, {"role": "assistant", "content": call}]]
    out = env.step(convs, [row] * 4)
    assert out.done.tolist() == [False, True, False, True]
    assert out.rewards.tolist() == [0.0, 1.0, 0.0, 0.0]
    assert out.observations[0] == [{"role": "tool", "name": "add", "content": "5758"}] * 2
    assert out.observations[2][0]["content"].startswith("error: malformed tool call")
    assert out.metadata[0]["tool_calls"] == 2 and out.metadata[2]["tool_errors"] == 1
    assert out.metadata[1]["correct"] is True
    assert env.tool_schemas == NativeToolArithmeticEnvironment.default_tool_schemas()
    with pytest.raises(ValueError, match="unknown tool-call format"):
        NativeToolEnvironment([add_tool()], call_format="xml")


def test_the_native_demonstration_is_what_the_chat_template_renders():
    tok = build_bpe_tokenizer()
    tools = [add_tool().schema()]
    user = [{"role": "user", "content": "4821+937"}]
    prompt = tok.apply_chat_template(user, tools=tools, tokenize=False, add_generation_prompt=True)
    call = {"type": "function", "function": {"name": "add", "arguments": {"a": 4821, "b": 937}}}
    whole = tok.apply_chat_template(user + [{"role": "assistant", "content": "", "tool_calls": [call]},
                                            {"role": "tool", "content": "5758"},
                                            {"role": "assistant", "content": "5758"}], tools=tools, tokenize=False)
    assert whole == prompt + native_tool_demonstration("4821+937", "5758") + "<|im_end|>\n"
    assert "add(a, b)" in prompt  # the tools reach the prompt through the template
