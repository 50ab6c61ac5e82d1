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
