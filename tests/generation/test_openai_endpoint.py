"""The OpenAI-compatible endpoint driven by the real ``openai`` client: tool calls in and out, exact ids per episode,
8 concurrent episodes batched into engine calls, OpenAI-style errors.

A scripted engine stands in for vLLM here (the test is about the endpoint's recording and protocol around the
engine): it "samples" the BPE tokenizer's encoding of a scripted reply chosen from the prompt, with a logprob per
token that encodes the token's position, so every recorded logprob can be traced back to what the engine returned.
The real-engine test (vLLM + Megatron-Core, logprobs against the policy's after a refit) is
tests/multiturn/test_openai_agent_session.py."""

import json

import openai
import pytest

from rlkit.envs.tool_arithmetic import add_tool
from rlkit.generation.base import Generation, SamplingSettings
from rlkit.generation.openai_server import OpenAIEndpoint
from rlkit.models.bpe import build_bpe_tokenizer
from rlkit.stages.agent_rollout import agent_rollout

TOK = build_bpe_tokenizer()
TOOLS = [add_tool().schema()]


def call_text(a, b):
    return '<tool_call>\n' + json.dumps({"name": "add", "arguments": {"a": a, "b": b}}) + '\n</tool_call>'


class ScriptedEngine:
    """Calls the tool on a prompt without a tool response yet, then answers with the response's number."""

    def __init__(self, canonical=True):
        self.calls, self.canonical = [], canonical

    def generate(self, prompt_token_ids, n, sampling):
        samples = []
        for ids in prompt_token_ids:
            text = TOK.decode(ids)
            if "<tool_response>" in text:
                reply = text.rsplit("<tool_response>\n", 1)[1].split("\n", 1)[0]
            else:
                a, b = text.rsplit("<|im_start|>user\n", 1)[1].split("<|im_end|>")[0].split("+")
                reply = call_text(int(a), int(b))
            pieces = [reply] if self.canonical else list(reply)  # one character at a time: not BPE's own split
            out = [t for piece in pieces for t in TOK.encode(piece, add_special_tokens=False)] + [TOK.eos_token_id]
            samples += [(out, [-0.001 * (k + 1) - 0.1 * len(self.calls) for k in range(len(out))], reply, "stop")] * n
        self.calls.append(([list(p) for p in prompt_token_ids], samples))
        return Generation.from_samples(prompt_token_ids, samples, n)


async def agent(client, row):
    """A tool-using agent as people write them: call the model, run its tool calls, call it again."""
    messages = [{"role": "user", "content": row["prompt"]}]
    for _ in range(3):
        response = await client.chat.completions.create(model="rlkit-policy", messages=messages, tools=TOOLS)
        message = response.choices[0].message
        messages.append(message.model_dump(exclude_none=True))
        if not message.tool_calls:
            return float(message.content.strip() == row["answer"])
        for call in message.tool_calls:
            args = json.loads(call.function.arguments)
            messages.append({"role": "tool", "tool_call_id": call.id, "content": str(args["a"] + args["b"])})
    return 0.0


@pytest.fixture()
def endpoint():
    with OpenAIEndpoint(ScriptedEngine(), TOK, SamplingSettings(max_new_tokens=100, seed=0), max_model_len=512) as e:
        yield e


def test_eight_concurrent_agent_episodes_become_exact_trajectory_rows(endpoint):
    rows = [{"prompt": f"{1000 + 7 * i}+{20 + i}", "answer": str(1020 + 8 * i)} for i in range(4)]
    batch = agent_rollout(endpoint, agent, rows, num_generations=2, policy_version=3)
    assert batch.batch_size == 8 and batch.rewards.tolist() == [1.0] * 8 and batch.policy_version == 3
    engine = endpoint.generator
    # requests of concurrent episodes share engine calls: two turns of 8 episodes in far fewer than 16 calls
    assert len(engine.calls) <= 4 and sum(len(p) for p, _ in engine.calls) == 16
    sampled = [s for _, samples in engine.calls for s in samples]
    for row in range(8):
        ids = batch.input_ids[row][batch.attention_mask[row]].tolist()
        mask = batch.loss_mask[row][batch.attention_mask[row]].tolist()
        # the row is exactly the template's rendering of the whole conversation (with tools), never re-tokenized
        prompt, answer = rows[row // 2]["prompt"], rows[row // 2]["answer"]
        a, b = map(int, prompt.split("+"))
        messages = [{"role": "user", "content": prompt},
                    {"role": "assistant", "content": "", "tool_calls": [{"type": "function", "function": {
                        "name": "add", "arguments": {"a": a, "b": b}}}]},
                    {"role": "tool", "content": answer}, {"role": "assistant", "content": answer}]
        reference = TOK.apply_chat_template(messages, tools=TOOLS, return_dict=True, return_assistant_tokens_mask=True)
        assert ids == reference["input_ids"][:-1]
        assert mask == [bool(m) for m in reference["assistant_masks"][:-1]]
        # the sampled ids sit where the mask says, with the engine's logprobs
        runs, k = [], 0
        while k < len(mask):
            if mask[k]:
                j = k
                while j < len(mask) and mask[j]:
                    j += 1
                runs.append((ids[k:j], batch.generator_logprobs[row][k:j].tolist()))
                k = j
            else:
                k += 1
        assert len(runs) == 2
        for run_ids, run_lps in runs:
            assert any(run_ids == list(s[0]) and run_lps == pytest.approx(list(s[1])) for s in sampled)
    assert endpoint.episodes == {}  # handed over to the batch


def test_openai_client_sees_tool_calls_n_samples_and_models(endpoint):
    client = openai.OpenAI(base_url=endpoint.base_url, api_key="x", max_retries=0)
    assert [m.id for m in client.models.list().data] == ["rlkit-policy"]
    response = client.chat.completions.create(model="rlkit-policy", messages=[{"role": "user", "content": "2+3"}],
                                              tools=TOOLS, n=3)
    assert len(response.choices) == 3 and all(c.finish_reason == "tool_calls" for c in response.choices)
    call = response.choices[0].message.tool_calls[0]
    assert call.function.name == "add" and json.loads(call.function.arguments) == {"a": 2, "b": 3}
    assert response.choices[0].message.content is None
    assert len(endpoint.episodes["default"].branches) == 3


def test_a_bad_request_gets_an_openai_style_error(endpoint):
    client = openai.OpenAI(base_url=endpoint.base_url, api_key="x", max_retries=0)
    bad_schema = [{"type": "function", "function": {"name": "add", "parameters": {"type": "objekt"}}}]
    with pytest.raises(openai.BadRequestError) as info:
        client.chat.completions.create(model="m", messages=[{"role": "user", "content": "1+1"}], tools=bad_schema)
    assert info.value.status_code == 400
    assert info.value.body["type"] == "invalid_request_error"
    assert info.value.body["param"] == "tools[0].function.parameters" and "not a valid JSON schema" in info.value.body["message"]
    with pytest.raises(openai.BadRequestError) as info:
        client.chat.completions.create(model="m", messages=[{"role": "user", "content": "1+1"}],
                                       tools=[{"type": "function", "function": {"parameters": {}}}])
    assert info.value.body["param"] == "tools.0.function.name"
    with pytest.raises(openai.BadRequestError, match="messages"):
        client.chat.completions.create(model="m", messages=[])
    assert endpoint.generator.calls == []  # nothing reached the engine


def test_sampled_ids_are_kept_even_where_the_tokenizer_would_split_the_text_otherwise():
    """An engine may sample a tokenization BPE would not produce (one token per character here); the episode's row
    keeps the sampled ids (re-rendering the returned messages would change them)."""
    engine = ScriptedEngine(canonical=False)
    with OpenAIEndpoint(engine, TOK, SamplingSettings(max_new_tokens=100), max_model_len=512) as endpoint:
        batch = agent_rollout(endpoint, agent, [{"prompt": "1234+56", "answer": "1290"}], 1, 0)
    ids = batch.input_ids[0][batch.attention_mask[0]].tolist()
    generated = [t for t, m in zip(ids, batch.loss_mask[0].tolist()) if m]
    assert generated == list(engine.calls[0][1][0][0]) + list(engine.calls[1][1][0][0])
    rerendered = TOK(TOK.decode(ids), add_special_tokens=False)["input_ids"]
    assert rerendered != ids and len(rerendered) < len(ids)  # so this test tells the two apart
    assert batch.rewards.tolist() == [1.0]


def test_an_agent_returning_messages_is_scored_by_the_env_with_each_component_kept(endpoint):
    from rlkit.envs.judge import RewardComponent, WeightedRewards
    from rlkit.run.metrics import rollout_metrics

    async def talker(client, row):
        messages = [{"role": "user", "content": row["prompt"]}]
        reply = await client.chat.completions.create(model="rlkit-policy", messages=messages, tools=TOOLS)
        return messages + [{"role": "assistant", "content": reply.choices[0].message.content or ""}]

    def called(prompts, completions, **columns):  # the engine's first reply is a tool call: no content left
        return [float(c == "") for c in completions]

    def length(prompts, completions, **columns):
        return [0.5] * len(completions)

    env = WeightedRewards([RewardComponent(called, 0.5), RewardComponent(length, 2.0)])
    batch = agent_rollout(endpoint, talker, [{"prompt": "1+2", "answer": "3"}], 2, 0, env=env)
    assert batch.rewards.tolist() == [1.5, 1.5]
    metrics = rollout_metrics(batch)
    assert metrics["rollout/reward/called_mean"] == 1.0 and metrics["rollout/reward/length_mean"] == 0.5
