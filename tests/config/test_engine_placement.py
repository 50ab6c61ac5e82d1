"""Where the vLLM engine runs when the config does not say: in this process, except under async GRPO, where it
gets its own process (bench/async_vs_sync.py measures why). A placement the config gives is kept."""

import pytest

from rlkit.config.loading import engine_placement, load_config

ASYNC = {"grpo.async_grpo.enabled": True, "loss_fn.off_policy_correction": "tis"}


@pytest.mark.parametrize("overrides, in_this_process", [
    ({}, True),                                                            # sync: in this process
    (ASYNC, False),                                                        # async: its own process
    ({**ASYNC, "policy.generation.colocated.enabled": True}, True),        # asked for: kept
    ({"policy.generation.colocated.enabled": False}, False),               # asked for: kept
    ({**ASYNC, "policy.generation.backend": "hf"}, True),                  # transformers runs in this process only
    ({"grpo.async_grpo.enabled": False}, True),
])
def test_engine_placement_default(overrides, in_this_process):
    assert load_config("quickstart", overrides).policy.generation.colocated.enabled is in_this_process


def test_engine_placement_leaves_its_input_alone():
    raw = {"grpo": {"async_grpo": {"enabled": True}}, "policy": {"generation": {"temperature": 0.7}}}
    out = engine_placement(raw)
    assert out["policy"]["generation"] == {"temperature": 0.7, "colocated": {"enabled": False}}
    assert raw == {"grpo": {"async_grpo": {"enabled": True}}, "policy": {"generation": {"temperature": 0.7}}}
