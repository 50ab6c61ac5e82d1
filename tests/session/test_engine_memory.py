"""The KV cache size the config asks for reaches the vLLM engine, below 1 GiB too.

Why it matters: on CPU the cache is allocated and zeroed at start, so its size is resident memory. The
quickstart asks for 0.125 GiB (its 32-token sequences need a few MiB); the legacy VLLM_CPU_KVCACHE_SPACE
variable counts whole GiB and overrides the engine argument, which had made it 1 GiB (~1 GB of RSS)."""

import pytest
import torch


@pytest.mark.skipif(torch.cuda.is_available(), reason="the KV cache size is a CPU-engine setting")
def test_quickstart_kv_cache_is_the_configured_size(session):
    cache = session.generator.llm.llm_engine.vllm_config.cache_config
    assert session.config.policy.generation.vllm_cfg.kv_cache_space_gib == 0.125
    assert cache.kv_cache_memory_bytes == 2**30 // 8


@pytest.mark.skipif(torch.cuda.is_available(), reason="the KV cache size is a CPU-engine setting")
@pytest.mark.parametrize("precision", ["float32", "bfloat16"])
def test_an_auto_kv_cache_is_the_blocks_its_sequences_need_by_vllms_own_count(model_factory, precision):
    """vLLM divides the bytes it is given by its own page size: an "auto" cache for 32 sequences of 160 tokens
    must come out as exactly 32 x 2 blocks of 128 tokens (a wrong per-token size gives half or twice that)."""
    from rlkit.config.components import GenerationConfig
    from rlkit.generation.vllm import DIRECT_ENGINE_SEQUENCES, VllmGenerator

    cfg = GenerationConfig(vllm_cfg={"precision": precision})
    assert cfg.vllm_cfg.kv_cache_space_gib == "auto"
    generator = VllmGenerator(model_factory("nano", "qwen3"), cfg, max_model_len=160, seed=0)
    try:
        cache = generator.llm.llm_engine.vllm_config.cache_config
        assert cache.block_size == 128 and cache.num_gpu_blocks == DIRECT_ENGINE_SEQUENCES * 2
    finally:
        generator.close()
