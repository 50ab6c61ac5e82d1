"""One random stream per sample: every (prompt, sample) of a vLLM call, of a step's rounds and of a run's steps
samples from its own seed, reproducible from the call's seed.

vLLM gives child j of an n-sample request the seed ``seed + j``; rlkit gave prompt i ``seed + i``, so sample
(i, j) and sample (i + 1, j - 1) shared one stream (23 distinct streams for a 16 x 8 batch). With identical
prompts that shows as identical completions, shifted by one sample from one group to the next; the vLLM test
checks that on the real engine."""

import pytest

from rlkit.config.components import GenerationConfig
from rlkit.generation.base import SamplingSettings
from rlkit.generation.base import request_seed
from rlkit.generation.vllm import VllmGenerator
from rlkit.run.sources import ROUND_SEED_STRIDE, step_seed
from tests.helpers import arithmetic_prompts


def streams(seed: int, prompts: int, n: int) -> list[int]:
    """The seeds vLLM gives the samples of one call: child j of prompt i samples with request_seed(...) + j."""
    return [request_seed(seed, i, n) + j for i in range(prompts) for j in range(n)]


def test_every_sample_of_a_batch_has_its_own_stream():
    assert len(set(streams(step_seed(0, 0), 16, 8))) == 16 * 8  # the former seed + i gave 23


def test_streams_stay_distinct_across_steps_and_rounds_and_are_reproducible():
    seeds = [s for step in range(50) for r in range(3) for s in streams(step_seed(1, step) + ROUND_SEED_STRIDE * r, 16, 8)]
    assert len(set(seeds)) == len(seeds) == 50 * 3 * 128
    assert streams(step_seed(1, 7), 16, 8) == streams(step_seed(1, 7), 16, 8)
    assert all(0 <= s < 2 ** 63 for s in seeds)


def test_a_group_too_large_for_a_seed_block_is_refused():
    with pytest.raises(ValueError, match="65536"):
        request_seed(0, 0, 1 << 17)


def test_identical_prompts_do_not_repeat_each_others_samples(model_factory):
    path = model_factory("nano", "llama", seed=2)
    generator = VllmGenerator(path, GenerationConfig(), max_model_len=128, seed=0)
    try:
        _, ids = arithmetic_prompts(1)
        n = 4
        gen = generator.generate(ids * 6, n, SamplingSettings(max_new_tokens=16, seed=5))
        again = generator.generate(ids * 6, n, SamplingSettings(max_new_tokens=16, seed=5))
    finally:
        generator.close()
    samples = [tuple(t) for t in gen.token_ids]  # prompt-major: sample (i, j) at i * n + j
    shifted = [samples[i * n + j] == samples[(i + 1) * n + j - 1] for i in range(5) for j in range(1, n)]
    assert sum(shifted) <= 1, shifted  # the former seeds made every one of these 15 pairs equal
    assert len(set(samples)) >= len(samples) - 2
    assert [tuple(t) for t in again.token_ids] == samples  # reproducible from the call's seed
