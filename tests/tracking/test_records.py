"""Run records replaced at start (rlkit.tracking.records): what a fresh and a resumed start leave, and that a
failure while writing them leaves the old ones. Plain files, no session."""

import json

import pytest

from rlkit.tracking import records
from rlkit.tracking.records import start_records


def jsonl(*steps):
    return "".join(json.dumps({"step": s, "x": s / 2}) + "\n" for s in steps)


@pytest.fixture
def run_dir(tmp_path):
    folder = tmp_path / "run"
    folder.mkdir()
    (folder / "config.yaml").write_text("old: config\n")
    (folder / "metrics.jsonl").write_text(jsonl(0, 1, 2, 3, 4) + '{"step": 5, "x"')  # killed mid-line
    (folder / "tables.jsonl").write_text(jsonl(2, 4))
    (folder / "summary.json").write_text("{}")
    (folder / "notes.txt").write_text("mine")
    return folder


def test_a_resumed_start_cuts_the_logs_back_to_its_checkpoint(run_dir):
    start_records(run_dir, "new: config\n", resumed_step=2)
    assert (run_dir / "config.yaml").read_text() == "new: config\n"
    assert (run_dir / "metrics.jsonl").read_text() == jsonl(0, 1, 2)
    assert (run_dir / "tables.jsonl").read_text() == jsonl(2)
    assert sorted(p.name for p in run_dir.iterdir()) == ["config.yaml", "metrics.jsonl", "notes.txt", "tables.jsonl"]


def test_a_fresh_start_empties_the_logs_and_leaves_other_files(tmp_path, run_dir):
    start_records(run_dir, "new: config\n")
    assert (run_dir / "metrics.jsonl").read_text() == (run_dir / "tables.jsonl").read_text() == ""
    assert (run_dir / "notes.txt").read_text() == "mine" and not (run_dir / "summary.json").exists()
    start_records(tmp_path / "new-run", "c: 1\n")  # a new folder: no tables.jsonl until a table is logged
    assert sorted(p.name for p in (tmp_path / "new-run").iterdir()) == ["config.yaml", "metrics.jsonl"]


def test_a_failure_while_writing_the_new_records_leaves_the_old_ones(run_dir, monkeypatch):
    before = {p.name: p.read_bytes() for p in run_dir.iterdir()}
    write = records._write_beside
    calls = []

    def disk_full_at_the_second(path, text):
        calls.append(path.name)
        if len(calls) == 2:
            raise OSError("No space left on device (simulated)")
        return write(path, text)

    monkeypatch.setattr(records, "_write_beside", disk_full_at_the_second)
    with pytest.raises(OSError, match="simulated"):
        start_records(run_dir, "new: config\n", resumed_step=2)
    assert {p.name: p.read_bytes() for p in run_dir.iterdir()} == before  # and no temporary file left
