"""evaluate() samples under the training rollouts' generation settings (``policy.generation``): the stop strings
always, the temperature, top-p and top-k when not greedy; the settings travel from the config through
``EvalSettings.from_config``, as a session builds them."""

import pytest

from rlkit.config.components import GenerationConfig
from rlkit.config.loading import load_config
from rlkit.envs.arithmetic import ArithmeticEnvironment
from rlkit.generation.base import Generation
from rlkit.stages.evaluate import evaluate
from rlkit.stages.settings import EvalSettings

ROWS = [{"prompt": f"{a}+{b}", "answer": str(a + b)} for a, b in ((2, 3), (4, 4), (1, 7), (6, 2), (3, 5), (9, 0))]


def eval_settings(model, *overrides):
    return EvalSettings.from_config(load_config("quickstart", [f"policy.model_name={model}", "policy.model_preset=null",
                                                               "policy.generation.backend=hf",
                                                               "policy.generation.max_new_tokens=12", *overrides]))


class Recording:
    """Stands in for the engine: the test is about the SamplingSettings evaluate() hands it."""

    def __init__(self, tokenizer):
        self.tokenizer, self.calls = tokenizer, []

    def generate(self, prompt_token_ids, n, sampling):
        self.calls.append(sampling)
        ids = self.tokenizer.encode("5", add_special_tokens=False) + [self.tokenizer.eos_token_id]
        samples = [(ids, [-0.1] * len(ids), "5", "stop")] * (len(prompt_token_ids) * n)
        return Generation.from_samples(prompt_token_ids, samples, n)


@pytest.fixture(scope="module")
def nano(model_factory):
    from transformers import AutoTokenizer

    path = model_factory("nano", "llama")
    return path, AutoTokenizer.from_pretrained(str(path))


def test_the_sampling_settings_evaluate_passes_carry_the_generation_config(nano):
    path, tok = nano
    generation = ["policy.generation.temperature=0.7", "policy.generation.top_p=0.9", "policy.generation.top_k=5",
                  "policy.generation.stop_strings=[';', 'END']"]
    for greedy, temperature in ((False, 0.7), (True, 0.0)):
        generator = Recording(tok)
        settings = eval_settings(path, *generation, f"eval.greedy={greedy}")
        evaluate(generator, tok, ArithmeticEnvironment(), ROWS, 0, settings)
        (sampling,) = generator.calls
        assert (sampling.temperature, sampling.top_p, sampling.top_k) == (temperature, 0.9, 5)
        assert sampling.stop_strings == (";", "END") and sampling.max_new_tokens == 12


def test_stop_strings_cut_held_out_completions_as_they_cut_rollouts(nano):
    """The HF generator on a tiny model: greedy completions without a stop string, then with a character of the
    first one as the stop string; each new completion is the old one up to that character."""
    from rlkit.generation.hf import HFGenerator

    path, tok = nano
    settings = eval_settings(path)
    generator = HFGenerator(path, GenerationConfig(backend="hf"), max_model_len=64)
    plain = evaluate(generator, tok, ArithmeticEnvironment(), ROWS, 0, settings).batch.completions
    stop = next(c for c in plain[0][1:] if c.strip() and c not in "'\"[],\\")  # not at the start: a cut shows
    cut = evaluate(generator, tok, ArithmeticEnvironment(), ROWS, 0,
                   eval_settings(path, f"policy.generation.stop_strings=['{stop}']"))
    assert list(cut.batch.completions) == [c.split(stop)[0] for c in plain]
    assert cut.batch.completions[0] != plain[0]


def test_sampled_evaluation_honours_top_k(nano):
    """Sampled at temperature 1.5 with top_k=1 is greedy decoding; without top_k it is not (real HF generator)."""
    from rlkit.generation.hf import HFGenerator

    path, tok = nano
    generator = HFGenerator(path, GenerationConfig(backend="hf"), max_model_len=64)
    greedy = evaluate(generator, tok, ArithmeticEnvironment(), ROWS, 0, eval_settings(path)).batch.completions
    sampled = ["eval.greedy=false", "policy.generation.temperature=1.5"]
    top1 = evaluate(generator, tok, ArithmeticEnvironment(), ROWS, 0,
                    eval_settings(path, *sampled, "policy.generation.top_k=1")).batch.completions
    free = evaluate(generator, tok, ArithmeticEnvironment(), ROWS, 0, eval_settings(path, *sampled)).batch.completions
    assert top1 == greedy and free != greedy
