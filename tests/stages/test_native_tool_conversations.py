"""Native JSON tool calls through the multi-turn rollout: the conversation's ids are exactly what the chat
template renders for the whole message list (tools included), and only the policy's tokens are trained on.

A scripted generator stands in for vLLM (the test is about the ids appended around it): each turn "samples" the
BPE tokenizer's own encoding of a fixed text, then EOS, as an engine sampling those tokens would return them.
"""

from rlkit.envs.tool_arithmetic import NativeToolArithmeticEnvironment
from rlkit.generation.base import Generation, SamplingSettings
from rlkit.models.bpe import build_bpe_tokenizer
from rlkit.stages.conversations import conversations
from rlkit.stages.settings import RolloutSettings

TOK = build_bpe_tokenizer()
CALL = '<tool_call>\n{"name": "add", "arguments": {"a": 4821, "b": 937}}\n</tool_call>'
BAD = '<tool_call>\n{"name": "add", "arguments": {"a": 4821,}}\n</tool_call>'


def qwen3_style_tokenizer():
    """The BPE tokenizer with Qwen3's thinking switch: ``enable_thinking=False`` writes an empty think block after
    the assistant header of the generation prompt (Qwen3's template does exactly this)."""
    tok = build_bpe_tokenizer()
    header = "{{- '<|im_start|>assistant\n' }}{%- endif %}"
    assert header in tok.chat_template
    tok.chat_template = tok.chat_template.replace(header, (
        "{{- '<|im_start|>assistant\n' }}{%- if enable_thinking is defined and enable_thinking is false %}"
        "{{- '<think>\n\n</think>\n\n' }}{%- endif %}{%- endif %}"))
    return tok


class ScriptedGenerator:
    def __init__(self, turns):
        self.turns, self.prompts = turns, []

    def generate(self, prompt_token_ids, n, sampling):
        self.prompts.append([list(p) for p in prompt_token_ids])
        text = self.turns[len(self.prompts) - 1]
        ids = TOK.encode(text, add_special_tokens=False) + [TOK.eos_token_id]
        lps = [-0.5] * len(ids)
        return Generation.from_samples(prompt_token_ids, [(ids, lps, text, "stop")] * (len(prompt_token_ids) * n), n)


def play(turns, max_turns=3):
    env = NativeToolArithmeticEnvironment(max_turns=max_turns)
    rows = [{"prompt": "4821+937", "answer": "5758"}]
    settings = RolloutSettings(num_generations=2, max_total_tokens=512, system_prompt="Use the tools.")
    return conversations(ScriptedGenerator(turns), TOK, env, rows, SamplingSettings(max_new_tokens=200, seed=0), 0,
                         settings)


def test_conversation_ids_equal_the_template_of_the_whole_message_list():
    batch = play([CALL + "\n" + CALL, "5758"])
    messages = [{"role": "system", "content": "Use the tools."}, {"role": "user", "content": "4821+937"},
                {"role": "assistant", "content": CALL + "\n" + CALL},
                {"role": "tool", "content": "5758"}, {"role": "tool", "content": "5758"},
                {"role": "assistant", "content": "5758"}]
    tools = NativeToolArithmeticEnvironment().tool_schemas
    reference = TOK.apply_chat_template(messages, tools=tools, tokenize=True, return_dict=True,
                                        return_assistant_tokens_mask=True)
    ids, mask = reference["input_ids"][:-1], reference["assistant_masks"][:-1]  # the template's trailing "\n"
    for row in range(2):
        n = int(batch.attention_mask[row].sum())
        assert batch.input_ids[row, :n].tolist() == ids
        # trained exactly on the assistant's tokens, as transformers' own assistant mask marks them
        assert batch.loss_mask[row, :n].tolist() == [bool(m) for m in mask]
        assert (batch.generator_logprobs[row][batch.loss_mask[row]] == -0.5).all()
    text = TOK.decode(ids)
    assert text.count("<tool_response>\n5758\n</tool_response>") == 2 and "add(a, b)" in text
    assert batch.rewards.tolist() == [1.0, 1.0]
    assert [m["turns"] for m in batch.env_metadata] == [2, 2]


def test_malformed_json_gets_an_error_observation_and_the_conversation_goes_on():
    batch = play([BAD, CALL, "5758"])
    text = TOK.decode(batch.input_ids[0][batch.attention_mask[0]])
    assert text.count("<tool_response>\nerror: malformed tool call") == 1
    assert text.count("<tool_response>\n5758\n</tool_response>") == 1
    assert batch.rewards.tolist() == [1.0, 1.0] and batch.env_metadata[0]["turns"] == 3
    assert batch.reward_errors == ()
    # the error observation is the environment's: not trained on
    response = TOK.encode("error", add_special_tokens=False)
    trained = batch.input_ids[0][batch.loss_mask[0]].tolist()
    assert TOK.decode(trained).count("error") == 0 and response


def test_thinking_kwargs_reach_every_render_of_a_conversation():
    """``chat_template_kwargs`` are passed to the prompt's render and to each appended message's."""
    tok = qwen3_style_tokenizer()
    counts = {}
    for kwargs in (None, {"enable_thinking": True}, {"enable_thinking": False}):
        gen = ScriptedGenerator([CALL, "5758"])
        settings = RolloutSettings(num_generations=1, max_total_tokens=512, chat_template_kwargs=kwargs)
        conversations(gen, tok, NativeToolArithmeticEnvironment(max_turns=2), [{"prompt": "4821+937", "answer": "5758"}],
                      SamplingSettings(max_new_tokens=200), 0, settings)
        counts[str(kwargs)] = [tok.decode(p[0]).count("<think>\n\n</think>\n\n") for p in gen.prompts]
        assert tok.decode(gen.prompts[1][0]).count("<tool_response>\n5758\n</tool_response>") == 1
    # the second turn's prompt holds the first turn's generation prompt and its own
    assert counts == {"None": [0, 0], "{'enable_thinking': True}": [0, 0], "{'enable_thinking': False}": [1, 2]}
