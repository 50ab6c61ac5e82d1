"""vLLM samples from the distribution the trainer's logprobs assume: the model's softmax at ``temperature``.

The statistic: for each sampled token, its log-probability under the tempered distribution at its position plus that
distribution's entropy. Drawn from that very distribution, it averages 0 at every position (given the prefix), so
over all sampled tokens its mean is 0 within a few standard errors; the same samples read against another
temperature's distribution are far from 0 (the check has the power to see a sampler at the wrong temperature).
Reference: transformers' forward of the same folder in float64. (A logprob check alone, test_vllm_refit.py, cannot
see this: it compares the logprobs of whatever tokens were drawn, not how often each is drawn.)"""

import pytest
import torch

from rlkit.config.components import GenerationConfig
from rlkit.generation.base import SamplingSettings
from rlkit.generation.vllm import VllmGenerator
from tests.helpers import arithmetic_prompts

TEMPERATURE, SAMPLES, NEW_TOKENS = 0.7, 48, 16


@pytest.fixture(scope="module")
def sampled(model_factory, tmp_path_factory):
    """(folder, prompt ids [N], sampled completions [N * SAMPLES]) at TEMPERATURE from the nano Llama with its output
    layer scaled by 8: a random model's next-token distribution is nearly uniform, where every temperature samples
    alike; scaled, its entropy at T=0.7 is ~3.5 nats of the 4.9 of uniform, and a temperature shows (samples drawn
    at 0.8 and read at 0.7: -0.32, 15 standard errors; drawn and read at 0.7: -0.01 +- 0.02)."""
    import shutil

    from transformers import AutoModelForCausalLM

    path = tmp_path_factory.mktemp("peaked") / "model"
    shutil.copytree(model_factory("nano", "llama"), path)
    model = AutoModelForCausalLM.from_pretrained(str(path), dtype=torch.float32)
    with torch.no_grad():
        model.lm_head.weight.mul_(8.0)
    model.save_pretrained(path)
    _, ids = arithmetic_prompts(8)
    generator = VllmGenerator(path, GenerationConfig(), max_model_len=128, seed=0)
    try:
        generation = generator.generate(ids, SAMPLES, SamplingSettings(temperature=TEMPERATURE,
                                                                         max_new_tokens=NEW_TOKENS, seed=11))
    finally:
        generator.close()
    return path, ids, generation.token_ids


def logprob_plus_entropy(path, ids, completions, temperature: float) -> torch.Tensor:
    """log p_T(token) + H(p_T) at every sampled token [total tokens], float64 by transformers."""
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(str(path), dtype=torch.float64).eval()
    out = []
    for i, completion in enumerate(completions):
        prompt = ids[i // SAMPLES]
        with torch.no_grad():
            logits = model(torch.tensor([list(prompt) + list(completion)])).logits[0, len(prompt) - 1:-1]
        logp = torch.log_softmax(logits / temperature, -1)
        token_logp = logp.gather(-1, torch.tensor(completion)[:, None])[:, 0]
        out.append(token_logp - (logp.exp() * logp).sum(-1))
    return torch.cat(out)


def test_sampled_tokens_follow_the_tempered_softmax(sampled):
    d = logprob_plus_entropy(*sampled, TEMPERATURE)
    standard_error = d.std() / len(d) ** 0.5
    assert len(d) > 3000
    assert abs(d.mean()) < 4 * standard_error, (d.mean().item(), standard_error.item())


@pytest.mark.parametrize("wrong", [1.0, 0.6])
def test_the_check_sees_samples_read_at_another_temperature(sampled, wrong):
    d = logprob_plus_entropy(*sampled, wrong)
    standard_error = d.std() / len(d) ** 0.5
    assert abs(d.mean()) > 10 * standard_error, (d.mean().item(), standard_error.item())
