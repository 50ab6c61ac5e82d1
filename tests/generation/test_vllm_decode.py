"""Completions decoded by the caller (``decode_completions``) against vLLM's own detokenizer.

``VllmGenerator.sample`` asks vLLM not to detokenize (it is ~10% of a generate call's CPU on a tiny model, and
an engine in a Ray actor is async GRPO's bottleneck); the texts are then decoded from the token ids in the
caller's process. They must be the texts vLLM would have produced: real vLLM engines, the same seeds, so the
same token ids, decoded once by vLLM (``detokenize=True``) and once by ``decode_completions``; exact equality.
Random tiny models sample arbitrary tokens, so the byte-level BPE's samples hold partial UTF-8 sequences, and
both finish reasons occur (a stop token, which vLLM leaves out of the text, and the length limit).
"""

import dataclasses

import pytest
from tokenizers import Tokenizer, decoders, models, pre_tokenizers
from transformers import PreTrainedTokenizerFast

from rlkit.config.components import GenerationConfig
from rlkit.data.chat import render_prompts
from rlkit.generation.base import Generation, SamplingSettings
from rlkit.generation.vllm import VllmGenerator, decode_completions


@pytest.fixture(scope="module", params=["char", "bpe"])
def generator(request, tmp_path_factory):
    from rlkit.models import make_model

    path = make_model(tmp_path_factory.mktemp(f"decode-{request.param}"), "nano", "qwen2", seed=5,
                      tokenizer=request.param)
    engine = VllmGenerator(path, GenerationConfig(), max_model_len=64, seed=0)
    yield engine
    engine.close()


def prompt_ids(tokenizer, count: int = 16) -> list[list[int]]:
    return render_prompts(tokenizer, [f"{a}+{3 * a}=" for a in range(count)])


def test_caller_decoding_equals_vllm_texts(generator, monkeypatch):
    prompts = prompt_ids(generator.tokenizer)
    sampling = SamplingSettings(temperature=1.0, max_new_tokens=24, seed=7)
    undecoded = generator.sample(prompts, 8, sampling)
    assert undecoded.texts is None
    with monkeypatch.context() as patch:
        patch.setattr(generator, "caller_decodes", False)  # vLLM's own detokenizer, as before
        by_vllm = generator.sample(prompts, 8, sampling)
    assert by_vllm.texts is not None
    assert undecoded.token_ids == by_vllm.token_ids and undecoded.logprobs == by_vllm.logprobs
    assert undecoded.finish_reasons == by_vllm.finish_reasons
    reasons = set(by_vllm.finish_reasons)
    assert reasons == {"stop", "length"}, reasons  # both rules are exercised
    assert decode_completions(undecoded, generator.tokenizer).texts == by_vllm.texts
    assert generator.generate(prompts, 8, sampling).texts == by_vllm.texts


def test_stop_strings_are_found_and_cut_by_the_engine(generator):
    prompts = prompt_ids(generator.tokenizer, 4)
    plain = generator.generate(prompts, 4, SamplingSettings(temperature=1.0, max_new_tokens=24, seed=3))
    stop = next(t[2:4] for t in plain.texts if len(t) >= 6 and t[2:4].strip())  # occurs in some completion
    cut = generator.sample(prompts, 4, SamplingSettings(temperature=1.0, max_new_tokens=24, seed=3,
                                                        stop_strings=(stop,)))
    assert cut.texts is not None and all(stop not in t for t in cut.texts)
    assert any(len(c) < len(p) for c, p in zip(cut.texts, plain.texts))


def test_a_completion_is_decoded_as_the_continuation_of_its_prompt():
    # a SentencePiece-style tokenizer (Llama 2, Mistral): '▁' marks a word start, and the decoder drops it
    # at the start of a text; a completion decoded on its own would lose the space after its prompt
    vocab = {"<eos>": 0, "▁Hello": 1, "▁world": 2, "!": 3}
    core = Tokenizer(models.WordLevel(vocab, unk_token="<eos>"))
    core.pre_tokenizer, core.decoder = pre_tokenizers.Metaspace(), decoders.Metaspace()
    tok = PreTrainedTokenizerFast(tokenizer_object=core, eos_token="<eos>")
    samples = [((2, 3, 0), (-1.0,) * 3, "", "stop"), ((2, 2), (-1.0,) * 2, "", "length")]
    generation = dataclasses.replace(Generation.from_samples([[1]], samples, 2), texts=None)  # as sample() gives
    assert tok.decode([2, 3]) == "world!"  # the completion alone
    assert decode_completions(generation, tok).texts == (" world!", " world world")
