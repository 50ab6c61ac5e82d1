"""The on-disk rollout store: a batch round-trips bit for bit through parquet, and the folder stays within its
row and byte bounds however long the run (batches are random stand-ins: these tests are about the files)."""

import json

import pytest
import torch

from rlkit.tracking.rollout_store import RolloutFiles, StepFacts, read_step, stored_steps, table_batch
from rlkit.tracking.runs import open_run
from tests.helpers import random_batch


def full_batch(seed=0, b=8, t=20):
    """A batch with every stored field filled, group size 2, rows and metadata."""
    g = torch.Generator().manual_seed(seed + 100)
    batch = random_batch(b=b, t=t, seed=seed, group_size=2)
    floats = lambda: torch.randn(b, t, generator=g) * batch.loss_mask  # noqa: E731
    return batch.with_(rewards=torch.randn(b, generator=g), prev_logprobs=floats(), ref_logprobs=floats(),
                       entropy=floats(), generator_logprobs=floats(),
                       rows=tuple({"prompt": f"q{i}", "answer": str(i)} for i in range(b // 2)),
                       env_metadata=tuple({"i": i} for i in range(b)), completions=tuple(f"c{i}" for i in range(b)))


def test_a_batch_round_trips_bit_for_bit(tmp_path):
    batch = full_batch()
    files = RolloutFiles(tmp_path)
    files.write(batch, StepFacts(step=3, policy_version=3, seed=17), max_rows=100, max_bytes=10**9)
    back = table_batch(read_step(tmp_path, 3))
    for name in ("input_ids", "attention_mask", "loss_mask", "generator_logprobs", "prev_logprobs", "ref_logprobs",
                 "advantages", "entropy", "rewards"):
        a, b = getattr(batch, name), getattr(back, name)
        assert a.dtype == b.dtype and torch.equal(a, b), name
    assert back.turn_rewards is None
    assert (back.prompts, back.completions, back.finish_reasons) == (batch.prompts, batch.completions,
                                                                      batch.finish_reasons)
    assert back.rows == batch.rows and back.env_metadata == batch.env_metadata
    assert (back.group_size, back.policy_version, back.rollout_step) == (2, 0, 2)
    table = read_step(tmp_path, 3).to_pandas()
    assert list(table["seed"].unique()) == [17] and list(table["sample"]) == list(range(8))
    assert json.loads(table["row"][3]) == {"prompt": "q1", "answer": "1"}  # sample 3 is of group 1


def test_open_run_reads_a_stored_batch_and_names_the_kept_steps(tmp_path):
    (tmp_path / "metrics.jsonl").write_text(json.dumps({"step": 1, "loss": 0.5}) + "\n")
    RolloutFiles(tmp_path).write(full_batch(), StepFacts(1, 1, 0), 100, 10**9)
    run = open_run(tmp_path)
    assert torch.equal(run.batch(1).advantages, full_batch().advantages)
    assert len(run.rollouts()) == 8 and set(run.rollouts()["step"]) == {1}
    with pytest.raises(KeyError, match=r"no batch of step 2 \(steps 1..1 are kept"):
        run.batch(2)


def test_a_table_no_step_logged_is_an_error_naming_the_period_not_an_empty_frame(tmp_path):
    (tmp_path / "metrics.jsonl").write_text("".join(json.dumps({"step": s, "loss": 0.5}) + "\n" for s in (1, 2, 3)))
    (tmp_path / "config.yaml").write_text("logger:\n  sample_table_period: 10\n")
    run = open_run(tmp_path)
    with pytest.raises(KeyError, match=r"no table 'rollout/samples' .*\(logged: none\); "
                                       r"logger.sample_table_period=10 logs one every 10 steps, this run has 3.*"
                                       r"\.rollouts\(\)"):
        run.table("rollout/samples")


@pytest.mark.parametrize("bound", ["rows", "bytes"])
def test_a_long_run_stays_under_the_disk_bound(tmp_path, bound):
    files = RolloutFiles(tmp_path)
    one = RolloutFiles(tmp_path / "probe").write(full_batch(), StepFacts(1, 1, 0), 100, 10**9).stat().st_size
    max_rows, max_bytes = (40, 10**9) if bound == "rows" else (10**6, int(3.5 * one))
    for step in range(1, 21):
        files.write(full_batch(seed=step), StepFacts(step, step, step), max_rows, max_bytes)
        on_disk = sorted((tmp_path / "rollouts").glob("*.parquet"))
        assert sum(p.stat().st_size for p in on_disk) <= max_bytes
        assert len(on_disk) * 8 <= max_rows
    kept = stored_steps(tmp_path)
    assert kept == list(range(21 - len(kept), 21)) and len(kept) == (5 if bound == "rows" else 3)
    # a new writer over the same folder (a resumed session) sees the files there and keeps the bound too
    RolloutFiles(tmp_path).write(full_batch(seed=99), StepFacts(21, 21, 21), max_rows, max_bytes)
    assert stored_steps(tmp_path) == kept[1:] + [21]


def test_zero_bounds_write_nothing(tmp_path):
    assert RolloutFiles(tmp_path).write(full_batch(), StepFacts(1, 1, 0), 0, 10**9) is None
    assert stored_steps(tmp_path) == []
