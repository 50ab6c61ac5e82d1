"""policy.generation.backend=megatron against vLLM on the same weights: greedy completions token for token.

Its own module: one session with vLLM as its engine and the Megatron generator built beside it on the policy's
model. (An in-process vLLM engine's shutdown tears down the process's default group, so a vLLM session cannot be
closed while another module-scoped session in this process still samples.)"""

import torch

import rlkit
from rlkit.generation.base import SamplingSettings
from tests.generation.test_megatron_generator import overrides


def test_greedy_decoding_equals_vllms_on_the_same_weights(tmp_path):
    """One session with vLLM as its engine; the Megatron generator built beside it on the policy's model."""
    with rlkit.Session.from_config("quickstart_nano", overrides(tmp_path, **{"policy.generation.backend": "vllm"})) as s:
        s.sft(40, progress=False)
        config = s.config.policy
        ours = s.current.policy.own_generator(config.generation, config.max_model_len, 0)
        prompts = [list(row) for row in s.rollout().input_ids[::2, :6].tolist()]
        greedy = SamplingSettings(temperature=0.0, max_new_tokens=8)
        mine, vllms = ours.generate(prompts, 1, greedy), s.current.generator.generate(prompts, 1, greedy)
    assert mine.token_ids == vllms.token_ids and mine.finish_reasons == vllms.finish_reasons
    for a, b in zip(mine.logprobs, vllms.logprobs):
        assert torch.allclose(torch.tensor(a), torch.tensor(b), atol=1e-4)  # vLLM's CPU kernels: ~1e-5 apart
