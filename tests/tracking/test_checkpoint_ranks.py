"""A session whose policy is a 2-rank Ray worker group checkpoints like a single-process one: each rank writes
its shard of the policy's distributed checkpoint, and a session loaded from it continues exactly like the
uninterrupted run (rel 1e-6 / abs 1e-7 on every non-timing metric; CPU fp32, one thread per rank)."""

import pytest

from rlkit.session import Session
from rlkit.tracking import checkpoint
from tests.tracking.conftest import deterministic, tiny_config

pytest.importorskip("ray")


# Slow target (~20-50 s): the contract test's [ray] case replays a 2-rank checkpoint in the default suite
@pytest.mark.slow
def test_a_two_rank_policy_group_saves_and_resumes_exactly(warm_model, tmp_path):
    # two data-parallel ranks; a KL penalty and a warm-up make the reference weights and the schedule matter
    cfg = tiny_config(warm_model, tmp_path, "policy.num_workers=2", "loss_fn.reference_policy_kl_penalty=0.05",
                      "policy.scheduler.warmup_steps=10")
    with Session(cfg) as s:
        s.step()
        s.save(tmp_path / "ckpt")
        saved = s.policy.hf_state_dict()
        later = [deterministic(s.step().values) for _ in range(2)]
    shards = sorted(p.name for p in (tmp_path / "ckpt" / "policy" / "shards").iterdir())
    assert len(shards) == 2, shards  # one file per rank: both ranks wrote (replicated tensors once)
    assert checkpoint.CheckpointInfo.read(tmp_path / "ckpt").policy_version == 1
    with Session.load(tmp_path / "ckpt") as r:
        assert r.step_count == 1 and r.policy.version == 1 and not r.stale
        got = r.policy.hf_state_dict()
        assert all((got[k] - saved[k]).abs().max() == 0 for k in saved)
        resumed = [deterministic(r.step().values) for _ in range(2)]
    assert any(m["train/kl"] > 0 for m in resumed)  # the restored reference is in play
    for a, b in zip(resumed, later):
        assert a == pytest.approx(b, rel=1e-6, abs=1e-7)
