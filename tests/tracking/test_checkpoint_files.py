"""Atomic folder writes, the crash-during-overwrite fallback, keep-last-k pruning (no session needed)."""

import json

import pytest

from rlkit.cli import build_parser
from rlkit.tracking.checkpoint import (CheckpointError, latest_checkpoint, list_checkpoints, prune_checkpoints,
                                       resolve_checkpoint, write_atomically)


def write_files(**files):
    def write(folder):
        for name, text in files.items():
            (folder / name).write_text(text)
    return write


def fake_checkpoint(folder, step):
    folder.mkdir(parents=True)
    (folder / "state.json").write_text(json.dumps({"step_count": step}))
    return folder


def test_overwrite_replaces_the_whole_folder_and_a_failed_one_changes_nothing(tmp_path):
    target = tmp_path / "ck"
    write_atomically(target, write_files(a="1", b="1"))
    write_atomically(target, write_files(a="2"))
    assert sorted(p.name for p in target.iterdir()) == ["a"] and (target / "a").read_text() == "2"

    def half_then_fail(folder):
        (folder / "a").write_text("3")
        raise KeyboardInterrupt  # e.g. Ctrl-C in a notebook halfway through a save

    with pytest.raises(KeyboardInterrupt):
        write_atomically(target, half_then_fail)
    assert (target / "a").read_text() == "2"
    assert [p.name for p in tmp_path.iterdir()] == ["ck"]  # no temporary or backup folder left


def test_a_crash_between_the_two_renames_of_an_overwrite_falls_back_to_the_old_folder(tmp_path):
    backup = fake_checkpoint(tmp_path / ".ck.old-1a2b3c4d", 7)  # what a kill between the renames leaves
    with pytest.warns(UserWarning, match="previous version survives"):
        assert resolve_checkpoint(tmp_path / "ck") == backup
    with pytest.raises(CheckpointError, match="no checkpoint"):
        resolve_checkpoint(tmp_path / "other")


def test_keep_last_and_latest_ignore_partial_and_foreign_folders(tmp_path):
    for step in (0, 2, 4, 10):
        fake_checkpoint(tmp_path / f"step_{step:06d}", step)
    (tmp_path / "step_000012").mkdir()  # no state.json: not a checkpoint
    (tmp_path / ".step_000014.tmp-1-abcdef12").mkdir()  # a dead writer's temporary folder
    (tmp_path / "notes").mkdir()
    assert [p.name for p in list_checkpoints(tmp_path)] == ["step_000000", "step_000002", "step_000004", "step_000010"]
    assert resolve_checkpoint(tmp_path) == latest_checkpoint(tmp_path) == tmp_path / "step_000010"
    assert [p.name for p in prune_checkpoints(tmp_path, keep_last=2)] == ["step_000000", "step_000002"]
    assert [p.name for p in list_checkpoints(tmp_path)] == ["step_000004", "step_000010"]
    assert not any(p.name.startswith(".trash") for p in tmp_path.iterdir())


def test_train_command_takes_resume():
    args = build_parser().parse_args(["train", "quickstart", "grpo.max_num_steps=5", "--resume"])
    assert args.resume and args.overrides == ["grpo.max_num_steps=5"]
    assert not build_parser().parse_args(["train", "quickstart"]).resume
