"""Sweeps (rlkit.sweep; here for the tracking fixtures): grid parsing, session reuse that reproduces a fresh session, wandb grouping, table and plot."""

import csv
import json
import struct

import pytest

from rlkit.errors import ConfigError
from rlkit.session import Session
from rlkit.sweep import can_reuse, parse_grid, run_name, run_sweep
from tests.tracking.conftest import deterministic, tiny_config, tiny_overrides


def test_parse_grid_reads_yaml_values_and_reports_every_bad_entry():
    grid = parse_grid(["loss_fn.ratio_clip_max=0.2,0.28", "seed=0,1,2", "policy.optimizer.betas=[0.9,0.99],[0.8,0.9]",
                       "loss_fn.policy_loss=ppo_clip", "policy.optimizer.lr=3e-4,1E3"])
    assert grid == {"loss_fn.ratio_clip_max": [0.2, 0.28], "seed": [0, 1, 2], "policy.optimizer.lr": [3e-4, 1e3],
                    "policy.optimizer.betas": [[0.9, 0.99], [0.8, 0.9]], "loss_fn.policy_loss": ["ppo_clip"]}
    with pytest.raises(ConfigError) as e:
        parse_grid(["seed", "a.b=", "seed=1"])
    assert len(e.value.problems) == 2


def test_run_names_say_the_grid_point_and_a_seeds_only_grid_adds_no_label():
    assert run_name("quickstart_nano", [("loss_fn.ratio_clip_max", 0.28)], 1) == "quickstart_nano-ratio_clip_max=0.28-seed1"
    assert run_name("quickstart_nano", [], 0) == "quickstart_nano-seed0"  # was quickstart_nano-base-seed0


def test_reuse_only_when_model_generator_and_data_are_unchanged(tmp_path):
    base = tiny_config(tmp_path / "m", tmp_path)
    assert can_reuse(base, tiny_config(tmp_path / "m", tmp_path, "seed=3", "loss_fn.ratio_clip_max=0.3",
                                       "policy.optimizer.lr=1e-3", "grpo.num_prompts_per_step=2"))
    for change in ("policy.train_micro_batch_size=8", "policy.generation.temperature=0.7", "data.num_train=100",
                   "env.name=math"):
        assert not can_reuse(base, tiny_config(tmp_path / "m", tmp_path, change)), change


def wandb_records(path):
    """The protobuf records of a wandb offline run file (LevelDB-log framing: 7-byte header, 32 KiB blocks)."""
    from wandb.proto import wandb_internal_pb2 as pb

    data = path.read_bytes()
    assert data[:4] == b":W&B"
    pos, block, pending, records = 7, 32768, b"", []
    while pos + 7 <= len(data):
        if block - pos % block < 7:
            pos += block - pos % block
            continue
        _, length, kind = struct.unpack("<IHB", data[pos:pos + 7])
        if kind == 0:
            break
        chunk, pos = data[pos + 7:pos + 7 + length], pos + 7 + length
        pending = chunk if kind in (1, 2) else pending + chunk
        if kind in (1, 4):
            record = pb.Record()
            record.ParseFromString(pending)
            records.append(record)
    return records


def metric_lines(path):
    return [deterministic(json.loads(line)) for line in path.read_text().splitlines()]


def test_sweep_of_two_values_by_two_seeds(warm_model, tmp_path):
    grid = {"policy.optimizer.lr": [3e-4, 3e-3], "seed": [0, 1]}
    base = tiny_overrides(warm_model, tmp_path, "grpo.max_num_steps=2", "checkpointing.enabled=true",
                          "checkpointing.save_period=1", "checkpointing.keep_last=2")
    result = run_sweep("quickstart", grid, base_overrides=base, out_dir=tmp_path / "sweep")

    assert [r.reused_session for r in result.runs] == [False, True, True, True]
    assert [(dict(r.point)["policy.optimizer.lr"], r.seed) for r in result.runs] == [
        (3e-4, 0), (3e-4, 1), (3e-3, 0), (3e-3, 1)]
    assert all(len(r.rewards) == 2 for r in result.runs)
    # periodic checkpoints with keep-last-2: step 0 (after the warm start) was pruned
    for run in result.runs:
        assert sorted(p.name for p in (run.run_dir / "checkpoints").iterdir()) == ["step_000001", "step_000002"]

    # four wandb offline runs, one group, the run names of the sweep
    files = sorted(result.folder.glob("*/wandb/offline-run-*/run-*.wandb"))
    runs = [next(r.run for r in wandb_records(f) if r.WhichOneof("record_type") == "run") for f in files]
    assert len(runs) == 4 and len({r.run_id for r in runs}) == 4
    assert {r.run_group for r in runs} == {result.group} and result.group == "sweep"
    assert sorted(r.display_name for r in runs) == sorted(r.name for r in result.runs)

    # comparison table: one row per learning rate, mean and sample std over the two seeds
    with open(result.folder / "comparison.csv") as f:
        table = list(csv.DictReader(f))
    assert [float(row["policy.optimizer.lr"]) for row in table] == [3e-4, 3e-3]
    for row, runs_of_point in zip(table, (result.runs[:2], result.runs[2:])):
        finals = [r.summary["reward_last_10_steps"] for r in runs_of_point]
        assert finals == pytest.approx([sum(r.rewards) / 2 for r in runs_of_point])
        assert int(row["seeds"]) == 2
        assert float(row["final_reward_mean"]) == pytest.approx(sum(finals) / 2)
        assert float(row["final_reward_std"]) == pytest.approx(abs(finals[0] - finals[1]) / 2 ** 0.5)
        accuracies = [r.summary["accuracy_after_rl"] for r in runs_of_point]
        assert float(row["accuracy_mean"]) == pytest.approx(sum(accuracies) / 2)
    markdown = (result.folder / "comparison.md").read_text()
    assert markdown.count("\n") == 4 and "final_reward_mean" in markdown
    png = (result.folder / "reward_curves.png").read_bytes()
    assert png[:8] == b"\x89PNG\r\n\x1a\n" and len(png) > 10_000

    # the last run (a reset session, third reuse) matches a fresh session with the same config
    last = result.runs[-1]
    fresh_cfg = tiny_config(warm_model, tmp_path / "fresh", "grpo.max_num_steps=2", "seed=1",
                            "policy.optimizer.lr=3e-3", f"name={last.name}")
    from rlkit.experiment import run_experiment

    with Session(fresh_cfg) as session:
        run_experiment(fresh_cfg, session=session, progress=False)
    fresh = metric_lines(tmp_path / "fresh" / last.name / "metrics.jsonl")
    swept = metric_lines(last.run_dir / "metrics.jsonl")
    assert len(fresh) == len(swept) == 4  # accuracy before, 2 steps, accuracy after
    assert any(line.get("train/grad_norm", 0) > 0 for line in swept)
    for got, want in zip(swept, fresh):
        assert got == pytest.approx(want, rel=1e-6, abs=1e-7)
