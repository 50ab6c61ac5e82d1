"""A notebook kernel outlives its sessions: close() then Session(...) again, five times in one process.

Megatron keeps its parallel layout in module globals and vLLM starts an engine (and a KV cache) per generator;
both must be released by ``close()`` so that the next session starts clean and memory does not pile up.
"""

from __future__ import annotations

import math
import resource

import pytest

import rlkit
from rlkit.errors import SessionClosedError

pytestmark = pytest.mark.timeout(600)


def rss_gib() -> float:
    """Current resident set size of this process (Linux /proc), in GiB."""
    with open("/proc/self/statm") as f:
        pages = int(f.read().split()[1])
    return pages * resource.getpagesize() / 2**30


def test_five_close_and_recreate_cycles_in_one_process(tmp_path):
    from megatron.core import parallel_state

    overrides = {
        "policy.model_name": str(tmp_path / "model"), "policy.model_preset": "nano",
        "policy.train_micro_batch_size": 8, "policy.logprob_batch_size": 16,
        "grpo.num_prompts_per_step": 4, "grpo.num_generations_per_prompt": 4, "grpo.use_dynamic_sampling": False,
        "sft.enabled": False, "data.num_train": 64, "data.num_validation": 8, "eval.num_prompts": 8,
    }
    memory, completions = [], []
    for cycle in range(5):
        session = rlkit.Session.from_config("quickstart", dict(overrides, seed=cycle % 2))
        assert parallel_state.model_parallel_is_initialized()
        assert session.step_count == 0 and session.policy.version == 0 and not session.stale
        metrics = session.step()
        assert math.isfinite(metrics["train/loss"]) and abs(metrics["train/token_mult_prob_error"] - 1) < 1e-3
        completions.append(session.batch.completions)
        session.close()
        assert not parallel_state.model_parallel_is_initialized()  # Megatron's globals are released
        assert "closed" in repr(session)
        with pytest.raises(SessionClosedError, match=r"this session is closed: session\.rollout\(\)"):
            session.rollout()  # a closed session refuses work instead of using a half-released engine
        memory.append(rss_gib())
    # A fresh session with the same seed samples the same completions: nothing leaked from the previous ones.
    assert completions[0] == completions[2] == completions[4] and completions[1] == completions[3]
    print("resident memory after each cycle (GiB):", [round(m, 2) for m in memory])
    # Each session holds a ~1 GiB vLLM KV cache; released, the process does not grow by that per cycle.
    assert memory[-1] - memory[1] < 1.0, f"resident memory after each cycle (GiB): {memory}"
