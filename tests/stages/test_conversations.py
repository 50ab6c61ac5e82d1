"""The multi-turn rollout stage's token bookkeeping, checked by hand on scripted conversations.

A scripted generator stands in for vLLM here: the tests are about the code around the generator (which tokens
are appended, masked, rewarded), so each turn's tokens are fixed in advance. tests/multiturn runs real vLLM.
"""

import time

import pytest
import torch

from rlkit.algorithms import count_valid
from rlkit.envs import Environment, EnvReturn
from rlkit.sandbox import SandboxLimits
from rlkit.envs.tool_env import ToolEnvironment
from rlkit.envs.tools import PythonTool
from rlkit.errors import RewardError
from rlkit.generation.base import Generation, SamplingSettings
from rlkit.models.tokenizer import build_char_tokenizer
from rlkit.stages.conversations import conversations
from rlkit.stages.settings import RolloutSettings

TOK = build_char_tokenizer()
V = TOK.convert_tokens_to_ids
BOS, END, USER, ASSISTANT, PAD = V("<|bos|>"), V("<|end|>"), V("<|user|>"), V("<|assistant|>"), V("<|pad|>")


class ScriptedGenerator:
    """Turn k of every conversation samples ``turns[k]``: (text, ends with EOS, logprob of each token)."""

    def __init__(self, turns):
        self.turns, self.calls = turns, []

    def generate(self, prompt_token_ids, n, sampling):
        self.calls.append(([list(p) for p in prompt_token_ids], n, sampling))
        text, eos, lp = self.turns[len(self.calls) - 1]
        ids = [V(c) for c in text] + ([END] if eos else [])
        cut = len(ids) > sampling.max_new_tokens  # the limit is honoured as an engine would
        ids = ids[:sampling.max_new_tokens]
        samples = [(ids, [lp] * len(ids), text, "stop" if eos and not cut else "length")] * (len(prompt_token_ids) * n)
        return Generation.from_samples(prompt_token_ids, samples, n)


class GoGoStop(Environment):
    """Answers "go" (reward 0.5) after turns 1 and 2, ends after turn 3 (reward 1.0)."""

    name, max_turns = "go-go-stop", 3

    def __init__(self):
        self.seen = []

    def step(self, conversations, rows):
        self.seen.append([list(c) for c in conversations])
        turn = sum(m["role"] == "assistant" for m in conversations[0])
        b = len(conversations)
        if turn < 3:
            return EnvReturn(torch.full((b,), 0.5), torch.zeros(b, dtype=torch.bool), [{"role": "user", "content": "go"}] * b,
                             [{"turn": turn}] * b, [])
        return EnvReturn.single_turn([1.0] * b, [{"turn": turn}] * b, [])


def play(generator, env, max_total_tokens=64, rows=({"prompt": "hi"},), g=1):
    return conversations(generator, TOK, env, list(rows), SamplingSettings(max_new_tokens=8, seed=3), 5,
                         RolloutSettings(g, max_total_tokens=max_total_tokens))


def test_a_three_turn_conversation_trains_exactly_on_the_generated_tokens():
    generator = ScriptedGenerator([("ab", True, -0.1), ("cd", False, -0.2), ("e", True, -0.3)])
    env = GoGoStop()
    batch = play(generator, env)
    a, b, c, d, e, g, o, h, i = (V(x) for x in "abcdeg" "ohi")
    prompt = [BOS, USER, h, i, END, ASSISTANT]
    go = [USER, g, o, END, ASSISTANT]
    # turn 2 was cut (no EOS): its EOS is a template token the environment's message brings
    expected = prompt + [a, b, END] + go + [c, d] + [END] + go + [e, END]
    assert batch.input_ids[0].tolist() == expected
    #                      prompt      turn 1     "go"        turn 2     EOS + "go"         turn 3
    mask = "".join(["0" * 6, "1" * 3, "0" * 5, "1" * 2, "0" * 6, "1" * 2])
    assert "".join(str(int(x)) for x in batch.loss_mask[0].tolist()) == mask
    assert batch.attention_mask.all()
    assert count_valid(batch.loss_mask).valid_tokens == 7  # the loss normalises by the 7 generated tokens
    lp = batch.generator_logprobs[0]
    assert lp[batch.loss_mask[0]].tolist() == pytest.approx([-0.1] * 3 + [-0.2] * 2 + [-0.3] * 2)
    assert (lp[~batch.loss_mask[0]] == 0).all()
    # each reward on the last token of the turn it answers; the conversation's reward is their sum
    expected_rewards = torch.zeros(24)
    expected_rewards[[8, 15, 23]] = torch.tensor([0.5, 0.5, 1.0])
    assert torch.equal(batch.turn_rewards[0], expected_rewards)
    assert batch.rewards.tolist() == [2.0]
    assert batch.finish_reasons == ("stop",) and batch.env_metadata[0]["turns"] == 3
    # later turns continue from the whole token sequence, the environment sees the messages
    assert generator.calls[1][0][0] == expected[:14] and generator.calls[2][0][0] == expected[:22]
    assert [m["role"] for m in env.seen[2][0]] == ["user", "assistant", "user", "assistant", "user", "assistant"]
    assert batch.policy_version == 5


def test_the_token_budget_ends_a_conversation_as_truncated():
    generator = ScriptedGenerator([("ab", True, -0.1), ("cd", True, -0.2), ("e", True, -0.3)])
    batch = play(generator, GoGoStop(), max_total_tokens=16)
    # after turn 1 (9 tokens) "go" (5) fits with room for one token; turn 2 then has 2 tokens of room
    assert generator.calls[1][2].max_new_tokens == 2
    assert batch.input_ids.shape[1] == 16
    assert batch.finish_reasons == ("length",)
    assert batch.loss_mask[0].sum() == 3 + 2


def test_groups_and_rows_follow_the_batch_convention():
    rows = [{"prompt": "hi"}, {"prompt": "hi"}]
    batch = play(ScriptedGenerator([("ab", True, -0.1), ("cd", True, -0.2), ("e", True, -0.3)]), GoGoStop(), rows=rows, g=3)
    assert batch.batch_size == 6 and batch.group_size == 3 and batch.num_prompts == 2
    picked = batch.select_groups(torch.tensor([1]))
    assert picked.turn_rewards.shape == (3, batch.input_ids.shape[1])


def test_a_hanging_tool_times_out_and_the_rollout_completes():
    env = ToolEnvironment([PythonTool(SandboxLimits(wall_seconds=1.0, cpu_seconds=1))], max_turns=2)
    generator = ScriptedGenerator([("<python>import time; time.sleep(60)</python>", True, -0.1), ("7", True, -0.2)])
    t0 = time.perf_counter()
    batch = play(generator, env, max_total_tokens=128, rows=[{"prompt": "hi", "answer": "7"}] * 4, g=2)
    seconds = time.perf_counter() - t0
    assert seconds < 10, f"8 hanging calls took {seconds:.1f} s: they must run concurrently, each cut at 1 s"
    assert batch.rewards.tolist() == [1.0] * 8  # the conversations went on to their answers
    second_prompt = TOK.decode(generator.calls[1][0][0], skip_special_tokens=False)
    assert "error: RuntimeError: timeout" in second_prompt


def test_the_conversation_view_highlights_exactly_the_trained_tokens():
    batch = play(ScriptedGenerator([("ab", True, -0.1), ("cd", False, -0.2), ("e", True, -0.3)]), GoGoStop())
    view = batch.show_conversation(0, TOK)
    assert [(text, trained) for text, trained, _, _ in view.pieces] == [
        ("<|bos|><|user|>hi<|end|><|assistant|>", False), ("ab<|end|>", True),
        ("<|user|>go<|end|><|assistant|>", False), ("cd", True),
        ("<|end|><|user|>go<|end|><|assistant|>", False), ("e<|end|>", True)]
    assert sum(n for _, trained, n, _ in view.pieces if trained) == int(batch.loss_mask[0].sum())
    assert "[[ab<|end|>]]<|user|>go" in repr(view)
    assert view._repr_html_().count("background:#c8f0c8;border-radius") == 3  # the three turns (and the legend)


class Answers(Environment):
    """Ends after turn 2 (reward 1); after turn 1 answers with ``message(row)``, or raises for the row "boom"."""

    name, max_turns = "answers", 2

    def __init__(self, message):
        self.message = message

    def step(self, conversations, rows):
        b = len(conversations)
        if any(r["prompt"] == "boom" for r in rows):
            raise RuntimeError("the grader crashed on 'boom'")
        if sum(m["role"] == "assistant" for m in conversations[0]) == 2:
            return EnvReturn.single_turn([1.0] * b, [{}] * b, [])
        return EnvReturn(torch.full((b,), 0.5), torch.zeros(b, dtype=torch.bool),
                         [self.message(r) for r in rows], [{}] * b, [])


def test_a_non_text_message_names_the_environment_and_the_fix():
    """Was a TypeError from inside the chat template."""
    env = Answers(lambda row: {"role": "tool", "content": {"stdout": "4"}})
    with pytest.raises(RewardError) as info:
        play(ScriptedGenerator([("ab", True, -0.1), ("c", True, -0.2)]), env)
    assert str(info.value) == (
        "environment 'answers' answered sample 0 with a message whose content is a dict, not text: {'role': 'tool', "
        "'content': {'stdout': '4'}}; a conversation's messages are rendered by the chat template, which takes text "
        "only. Fix: have Answers.step return each next message as {'role': 'user' or 'tool', 'content': <str>} "
        "(e.g. json.dumps(value) for structured output)")


def test_one_conversations_exception_fails_that_conversation_not_the_step():
    env = Answers(lambda row: {"role": "user", "content": "go"})
    rows = [{"prompt": "hi"}, {"prompt": "boom"}, {"prompt": "hi"}]
    with pytest.warns(UserWarning, match="1 of 3 sample"):
        batch = play(ScriptedGenerator([("ab", True, -0.1), ("c", True, -0.2)]), env, rows=rows)
    assert batch.rewards.tolist() == [1.5, 0.0, 1.5]
    assert batch.reward_errors == ("answers: sample 1: RuntimeError: the grader crashed on 'boom'",)
    assert [m["turns"] for m in batch.env_metadata] == [2, 1, 2]


def test_a_1mb_message_ends_its_conversation_loudly_and_fast():
    """Was dropped silently after 17 s of rendering and tokenizing it."""
    env = Answers(lambda row: {"role": "tool", "content": "x" * 1_000_000})
    t0 = time.perf_counter()
    with pytest.warns(UserWarning) as record:
        batch = play(ScriptedGenerator([("ab", True, -0.1), ("c", True, -0.2)]), env)
    assert time.perf_counter() - t0 < 2
    assert batch.finish_reasons == ("length",) and batch.rewards.tolist() == [0.5]
    assert str(record[0].message) == (
        "environment 'answers': 1 message(s) did not fit in their conversation's 64-token budget "
        "(policy.max_total_sequence_length), so those conversations ended there (finish reason 'length'); the longest "
        "was 1000000 characters with 54 tokens left. Fix: shorten the environment's messages (e.g. cut tool output to "
        "a few thousand characters), or raise policy.max_total_sequence_length")
