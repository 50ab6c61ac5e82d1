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


def test_an_engine_in_an_actor_is_refit_from_the_policys_rank_0_when_the_policy_runs_in_workers(model_factory,
                                                                                               monkeypatch):
    """Which sync goes with an engine in a Ray actor: this process sends, unless the policy runs in Ray workers,
    whose rank 0 then sends. The engine actor is stood in for: the test is about the pairing around it (the
    real pair refits in tests/generation/test_remote.py and tests/cluster/test_two_nodes.py)."""
    from types import SimpleNamespace

    import rlkit.generation.remote as remote
    from rlkit.weight_sync import BroadcastWeightSync, RanksBroadcastWeightSync

    monkeypatch.setattr(remote, "RemoteGenerator", lambda *args, **kwargs: SimpleNamespace(actor="engine"))
    for workers, sync_class in ((1, BroadcastWeightSync), (2, RanksBroadcastWeightSync)):
        config = load_config("quickstart", {"policy.model_name": str(model_factory("nano")), "policy.model_preset": None,
                                            "policy.generation.colocated.enabled": False, "policy.num_workers": workers})
        generator, sync = build_generation(config)
        assert type(sync) is sync_class and sync.generator is generator and sync.bucket_bytes == 256e6
