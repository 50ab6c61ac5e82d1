"""Which checkpoint a resume starts from: the newest that reads whole (warning about each damaged newer one),
an explicit step or folder, errors that list what exists; newer checkpoints set aside, not deleted. Fake
checkpoints (a state.json listing one file and its size), no session."""

import json

import pytest

from rlkit.cli import build_parser
from rlkit.errors import CheckpointError
from rlkit.tracking.checkpoint import (FORMAT, FORMAT_VERSION, chosen_checkpoint, list_checkpoints,
                                       resumable_checkpoint, set_aside_newer)


def checkpoint(folder, step):
    """A checkpoint that reads whole: its state.json lists weights.bin and its size."""
    path = folder / f"step_{step:06d}"
    path.mkdir(parents=True)
    (path / "weights.bin").write_bytes(bytes(100))
    (path / "state.json").write_text(json.dumps({"format": FORMAT, "format_version": FORMAT_VERSION,
                                                 "files": {"weights.bin": 100}, "run_state": {"step": step}}))
    return path


def test_resume_falls_back_past_damaged_newer_checkpoints_and_names_them(tmp_path):
    for step in (0, 2, 4, 6):
        checkpoint(tmp_path, step)
    (tmp_path / "step_000006" / "weights.bin").write_bytes(bytes(10))  # truncated
    (tmp_path / "step_000004" / "state.json").write_text("[]")  # not a checkpoint's state
    with pytest.warns(UserWarning) as warned:
        assert resumable_checkpoint(tmp_path) == tmp_path / "step_000002"
    message = str(warned[0].message)
    assert "skipped newer one(s): step_000006: " in message and "weights.bin is missing or truncated" in message
    assert "step_000004: " in message and "state.json holds no JSON object" in message


def test_resume_with_only_damaged_checkpoints_is_an_error_and_with_none_a_fresh_start(tmp_path):
    assert resumable_checkpoint(tmp_path / "none") is None
    checkpoint(tmp_path, 3)
    (tmp_path / "step_000003" / "state.json").write_bytes(b"\xff\xfe")  # not UTF-8
    with pytest.raises(CheckpointError, match=r"no checkpoint in .* reads whole.*step_000003: .*state.json is unreadable"):
        resumable_checkpoint(tmp_path)


def test_a_chosen_checkpoint_by_step_or_path_and_a_missing_one_lists_the_run_s(tmp_path):
    for step in (0, 5):
        checkpoint(tmp_path, step)
    assert chosen_checkpoint(tmp_path, "5") == chosen_checkpoint(tmp_path, 5) == tmp_path / "step_000005"
    assert chosen_checkpoint(tmp_path / "elsewhere", str(tmp_path / "step_000000")) == tmp_path / "step_000000"
    with pytest.raises(CheckpointError) as info:
        chosen_checkpoint(tmp_path, "7")
    assert str(info.value).startswith(f"resume from '7': there is no checkpoint at {tmp_path / 'step_000007'}. "
                                      f"This run's checkpoints in {tmp_path}: step_000000 (step 0), step_000005 (step 5).")
    (tmp_path / "step_000005" / "weights.bin").write_bytes(b"")
    with pytest.raises(CheckpointError, match="step_000005/weights.bin is missing or truncated"):  # no fallback
        chosen_checkpoint(tmp_path, 5)


def test_checkpoints_newer_than_the_resumed_one_are_kept_aside(tmp_path):
    for step in (0, 2, 4, 6):
        checkpoint(tmp_path, step)
    moved = set_aside_newer(tmp_path, 2)
    assert [p.name.split(".superseded-")[0] for p in moved] == ["step_000004", "step_000006"]
    assert all((p / "weights.bin").stat().st_size == 100 for p in moved)  # whole, not deleted
    assert [p.name for p in list_checkpoints(tmp_path)] == ["step_000000", "step_000002"]


def test_train_command_takes_resume_from():
    args = build_parser().parse_args(["train", "quickstart", "--resume-from", "40"])
    assert args.resume_from == "40" and not args.resume
    assert build_parser().parse_args(["train", "quickstart"]).resume_from is None
