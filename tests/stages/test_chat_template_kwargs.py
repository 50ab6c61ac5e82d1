"""data.chat_template_kwargs (Qwen3's enable_thinking) from the config to every render: the rollout's prompts,
SFT's batches and evaluation's prompts, through the stage settings a session builds.

A Qwen3-style template (the BPE test tokenizer's, with Qwen3's thinking switch) renders an empty think block
after the assistant header when ``enable_thinking`` is false; a recording generator stands in for vLLM (the test
is about the prompts it is given)."""

from rlkit.config.loading import load_config
from rlkit.data import render_prompt_texts
from rlkit.envs.arithmetic import ArithmeticEnvironment
from rlkit.generation.base import Generation, SamplingSettings
from rlkit.stages.evaluate import evaluate
from rlkit.stages.rollout import rollout
from rlkit.stages.settings import StageSettings
from rlkit.stages.sft import sft_batch_as_trajectories
from tests.stages.test_native_tool_conversations import qwen3_style_tokenizer

TOK = qwen3_style_tokenizer()
EMPTY_THINK = "<think>\n\n</think>\n\n"
ROWS = [{"prompt": "2+3", "answer": "5"}, {"prompt": "4+4", "answer": "8"}]


class Recording:
    def __init__(self):
        self.prompts = []

    def generate(self, prompt_token_ids, n, sampling):
        self.prompts += [TOK.decode(p) for p in prompt_token_ids]
        ids = TOK.encode("5", add_special_tokens=False) + [TOK.eos_token_id]
        return Generation.from_samples(prompt_token_ids, [(ids, [-0.1] * len(ids), "5", "stop")] * (len(prompt_token_ids) * n), n)


def settings(thinking):
    overrides = [] if thinking is None else [f"data.chat_template_kwargs={{enable_thinking: {str(thinking).lower()}}}"]
    return StageSettings.from_config(load_config("quickstart", overrides))


def test_enable_thinking_renders_differently_with_a_qwen3_style_template():
    on = render_prompt_texts(TOK, ["2+3"], template_kwargs={"enable_thinking": True})[0]
    off = render_prompt_texts(TOK, ["2+3"], template_kwargs={"enable_thinking": False})[0]
    assert on != off and off == on + EMPTY_THINK
    assert render_prompt_texts(TOK, ["2+3"])[0] == on  # the template's default: thinking on


def test_the_setting_reaches_rollouts_sft_and_evaluation():
    for thinking, expected in ((None, 0), (True, 0), (False, 1)):
        stage = settings(thinking)
        generator = Recording()
        rollout(generator, TOK, ROWS, SamplingSettings(max_new_tokens=4), 0, stage.rollout)
        assert [p.count(EMPTY_THINK) for p in generator.prompts] == [expected] * 2
        generator = Recording()
        result = evaluate(generator, TOK, ArithmeticEnvironment(), ROWS, 0, stage.eval)
        assert [p.count(EMPTY_THINK) for p in generator.prompts] == [expected] * 2 and result.accuracy == 0.5
        batch = sft_batch_as_trajectories(TOK, ROWS, "answer", stage.sft.system_prompt, stage.sft.tools,
                                          stage.sft.chat_template_kwargs)
        texts = [TOK.decode(ids[mask]) for ids, mask in zip(batch.input_ids, batch.attention_mask)]
        assert [t.count(EMPTY_THINK) for t in texts] == [expected] * 2
        # the loss covers the answer only, never the template's think block
        assert [TOK.decode(ids[mask]) for ids, mask in zip(batch.input_ids, batch.loss_mask)] == ["5<|im_end|>",
                                                                                                "8<|im_end|>"]
