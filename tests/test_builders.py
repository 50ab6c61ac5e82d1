"""build_generation: one setting picks the generator and the weight sync that refits it, as one pair.

Real engines (transformers, in-process vLLM). The engine in a Ray actor with its broadcast sync is built
the same way in tests/generation/test_remote.py, which refits it.
"""

import pytest

from rlkit.builders import build_generation
from rlkit.config.loading import load_config
from rlkit.weight_sync import ColocatedWeightSync


@pytest.mark.parametrize("backend, generator_class", [("hf", "HFGenerator"), ("vllm", "VllmGenerator")])
def test_an_engine_in_this_process_is_paired_with_the_in_process_hand_over(model_factory, backend, generator_class):
    config = load_config("quickstart", {"policy.model_name": str(model_factory("nano")), "policy.model_preset": None,
                                        "policy.generation.backend": backend,
                                        "policy.generation.refit_bucket_size_mb": 3.0,
                                        "policy.generation.vllm_cfg.max_model_len": 96})
    generator, sync = build_generation(config)
    try:
        assert type(generator).__name__ == generator_class and generator.max_model_len == 96
        assert type(sync) is ColocatedWeightSync  # one streamed hand-over: no bucket to size
    finally:
        generator.close()
