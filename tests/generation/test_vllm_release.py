"""A CPU engine that releases its weights while the policy trains (``vllm_cfg.release_weights_for_training``) and
gets them back from the refit: what it frees, that it refuses to sample meanwhile, that a refit missing a layer is
refused by name, and that after the refit it samples exactly what it sampled before (same weights, same seed:
identical tokens and logprobs) and agrees with the policy (fp32: max |logprob difference| <= 1e-3).
Also the input embedding's matmul kernel, which vLLM's CPU loader builds and nothing reads, is gone after each load.

Its own module: closing a vLLM engine destroys the default process group the other modules' policies share."""

import pytest
import torch

from rlkit.config.components import GenerationConfig, PolicyConfig
from rlkit.generation.base import SamplingSettings
from rlkit.generation.vllm import VllmGenerator
from rlkit.generation.vllm_cpu_kernels import drop_unused_cpu_embedding_kernels
from rlkit.policy.megatron.policy import MegatronPolicy
from rlkit.weight_sync import ColocatedWeightSync
from tests.generation.test_vllm_refit import MAX_LEN, mismatch, prompts

pytestmark = pytest.mark.skipif(torch.cuda.is_available(), reason="a GPU engine sleeps instead (vLLM's sleep mode)")


@pytest.fixture(scope="module")
def engines(tmp_path_factory):
    from rlkit.models import make_model

    path = make_model(tmp_path_factory.mktemp("release"), "tiny", "qwen3", seed=3, tie_word_embeddings=True)
    policy = MegatronPolicy(PolicyConfig(model_name=str(path), train_micro_batch_size=16))
    cfg = GenerationConfig(vllm_cfg={"release_weights_for_training": True})
    generator = VllmGenerator(path, cfg, max_model_len=MAX_LEN, seed=0)
    yield policy, generator
    generator.close()
    policy.close()


def sampled(generator):
    generation = generator.sample(prompts(False)[1], 4, SamplingSettings(max_new_tokens=24, seed=5))
    return generation.token_ids, generation.logprobs


def test_the_input_embeddings_unused_kernel_is_dropped_and_sampling_still_agrees(engines):
    policy, generator = engines
    assert generator.llm.collective_rpc(drop_unused_cpu_embedding_kernels) == [0]  # dropped at load already
    worst, mean, _ = mismatch(policy, generator)
    assert worst < 1e-3 and mean < 1e-4, (worst, mean)


def test_released_weights_come_back_whole_from_the_refit(engines):
    policy, generator = engines
    ColocatedWeightSync().sync(policy, generator)
    before = sampled(generator)

    freed = generator.release_weights()
    # every linear kernel (one fp32 copy of each 2-D tensor but the embedding), the embedding table, the tied
    # head's kernel (a second copy of the table)
    tensors = {name: t for group in policy.export_hf_groups() for name, t in group}
    table = tensors["model.embed_tokens.weight"].numel() * 4
    linear = sum(t.numel() * 4 for name, t in tensors.items() if t.dim() == 2 and "embed_tokens" not in name)
    assert freed == linear + 2 * table
    assert generator.weights_released and generator.release_weights() == 0  # once
    with pytest.raises(RuntimeError, match="release_weights_for_training"):
        sampled(generator)

    with pytest.raises(RuntimeError, match=r"did not reload 2 layer\(s\).*layers\.0\.mlp"):
        generator.update_weights((n, t) for n, t in tensors.items() if ".layers.0.mlp." not in n)
    assert generator.weights_released  # still refused: the stream lacked a released layer

    ColocatedWeightSync().sync(policy, generator)
    assert not generator.weights_released
    assert sampled(generator) == before  # the same weights rebuilt: the same tokens and logprobs, exactly
    worst, mean, _ = mismatch(policy, generator, seed=2)
    assert worst < 1e-3 and mean < 1e-4, (worst, mean)
