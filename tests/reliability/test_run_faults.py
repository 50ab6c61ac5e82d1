"""Faults around a run's folder: a failed start or a failed resume leaves it byte-identical (sha256 of every
file); a damaged newest checkpoint is passed over for the newest one that reads whole; ``--resume-from``
picks a checkpoint, and a missing one is an error that lists the run's checkpoints.

One real run (the nano model after a little SFT, so that steps learn; 4 GRPO steps, checkpoints at steps 0, 2 and 4) is made once; each test damages a
copy of its folder. The resumed runs are compared with it metric by metric (CPU fp32, same process:
bit-identical in practice; tolerance rel 1e-6 / abs 1e-7 as in tests/tracking/test_resume.py).
"""

import hashlib
import json
import shutil
from types import SimpleNamespace

import pytest

from rlkit.cli import main
from rlkit.config.loading import config_to_yaml, load_config
from rlkit.errors import CheckpointError, ModelError
from rlkit.experiment import run_experiment
from tests.tracking.conftest import deterministic, tiny_config, warm_model  # noqa: F401 (a fixture)

CHECKPOINTS = ["step_000000", "step_000002", "step_000004"]


def digests(folder):
    return {str(p.relative_to(folder)): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(folder.rglob("*")) if p.is_file()}


def metric_lines(folder):
    return [deterministic(json.loads(line)) for line in (folder / "metrics.jsonl").read_text().splitlines()]


@pytest.fixture(scope="module")
def finished_run(warm_model, tmp_path_factory):
    base = tmp_path_factory.mktemp("faults")
    model = shutil.copytree(warm_model, base / "model")
    cfg = tiny_config(model, base / "runs", "name=run", "checkpointing.enabled=true", "checkpointing.save_period=2",
                      "checkpointing.keep_last=3")
    summary = run_experiment(cfg, progress=False)
    folder = base / "runs" / "run"
    assert sorted(p.name for p in (folder / "checkpoints").iterdir()) == CHECKPOINTS
    metrics = metric_lines(folder)
    assert any(line.get("train/grad_norm", 0) > 0 for line in metrics[3:])  # the steps after step 2 learn
    return SimpleNamespace(cfg=cfg, model=model, folder=folder, summary=summary, metrics=metrics)


def copy_run(finished_run, tmp_path, **overrides):
    """A copy of the finished run's folder under ``tmp_path/runs``, and its config pointed there."""
    folder = shutil.copytree(finished_run.folder, tmp_path / "runs" / "run")
    cfg = load_config(finished_run.cfg.model_dump(mode="json"), {"logger.log_dir": str(tmp_path / "runs"), **overrides})
    return folder, cfg


def truncate(path, by=64):
    path.write_bytes(path.read_bytes()[:-by])


def a_shard(checkpoint):
    return sorted((checkpoint / "policy").rglob("*.safetensors"))[0]


def test_a_failed_start_over_an_existing_run_leaves_its_folder_byte_identical(finished_run, tmp_path):
    model = shutil.copytree(finished_run.model, tmp_path / "model")
    folder, cfg = copy_run(finished_run, tmp_path, **{"policy.model_name": str(model), "checkpointing.enabled": False})
    truncate(model / "model.safetensors")  # damaged after the config was validated (e.g. a copy still running)
    before = digests(folder)
    with pytest.raises(ModelError, match="is unreadable"):
        run_experiment(cfg, progress=False)
    assert digests(folder) == before


def test_a_fresh_start_over_checkpoints_of_the_same_run_is_refused_and_changes_nothing(finished_run, tmp_path):
    folder, cfg = copy_run(finished_run, tmp_path)
    before = digests(folder)
    with pytest.raises(CheckpointError, match=r"already holds checkpoints .*\(step_000000, step_000002, step_000004\)"):
        run_experiment(cfg, progress=False)
    assert digests(folder) == before


def test_a_resume_with_no_whole_checkpoint_fails_and_leaves_the_folder_byte_identical(finished_run, tmp_path):
    folder, cfg = copy_run(finished_run, tmp_path)
    (folder / "checkpoints" / "step_000004" / "state.json").write_text('{"format": "rlkit-che')  # cut short
    for name in CHECKPOINTS[:2]:
        truncate(a_shard(folder / "checkpoints" / name))
    before = digests(folder)
    with pytest.raises(CheckpointError) as info:
        run_experiment(cfg, progress=False, resume=True)
    assert digests(folder) == before
    message = str(info.value)
    assert "no checkpoint in" in message and "step_000004: " in message and "state.json is unreadable" in message
    assert "step_000002: " in message and "step_000000: " in message and "missing or truncated" in message


def test_resume_passes_over_a_damaged_newest_checkpoint_to_the_newest_whole_one(finished_run, tmp_path):
    folder, cfg = copy_run(finished_run, tmp_path)
    damaged = folder / "checkpoints" / "step_000004"
    truncate(a_shard(damaged))
    damaged_digests = digests(damaged)
    with pytest.warns(UserWarning, match=r"resuming from .*step_000002.*skipped newer one\(s\): step_000004: .*"
                                         r"missing or truncated"):
        summary = run_experiment(cfg, progress=False, resume=True)
    assert summary["resumed_from_step"] == 2 and summary["rl_steps"] == 4
    got = metric_lines(folder)
    assert [line["step"] for line in got] == [0, 1, 2, 3, 4, 4]
    for line, want in zip(got, finished_run.metrics):
        assert line == pytest.approx(want, rel=1e-6, abs=1e-7)
    # the damaged checkpoint is kept aside, not deleted; the resumed run wrote a whole step_000004 of its own
    aside = [p for p in (folder / "checkpoints").iterdir() if p.name.startswith("step_000004.superseded-")]
    assert len(aside) == 1 and digests(aside[0]) == damaged_digests
    from rlkit.tracking.checkpoint import read_checkpoint_state
    assert read_checkpoint_state(damaged)["run_state"]["step"] == 4


def test_resume_from_a_chosen_step_and_a_missing_one_lists_the_checkpoints(finished_run, tmp_path, capsys):
    folder, cfg = copy_run(finished_run, tmp_path, **{"grpo.max_num_steps": 3})
    config_path = tmp_path / "run.yaml"
    config_path.write_text(config_to_yaml(cfg))
    before = digests(folder)
    assert main(["train", str(config_path), "--quiet", "--resume-from", "3"]) == 2
    err = capsys.readouterr().err
    assert "resume from '3': there is no checkpoint at" in err
    assert "step_000000 (step 0), step_000002 (step 2), step_000004 (step 4)" in err
    assert digests(folder) == before

    assert main(["train", str(config_path), "--quiet", "--resume-from", "2"]) == 0
    summary = json.loads((folder / "summary.json").read_text())
    assert summary["resumed_from_step"] == 2 and summary["rl_steps"] == 3
    got = metric_lines(folder)
    assert [line["step"] for line in got] == [0, 1, 2, 3, 3]
    for line, want in zip(got[:4], finished_run.metrics):  # steps 0-3 as the first run logged them
        assert line == pytest.approx(want, rel=1e-6, abs=1e-7)
    names = sorted(p.name for p in (folder / "checkpoints").iterdir())
    assert names[:3] == ["step_000000", "step_000002", "step_000003"]
    assert len(names) == 4 and names[3].startswith("step_000004.superseded-")  # the old line's, kept
    assert "max_num_steps: 3" in (folder / "config.yaml").read_text()


# ---- one process per run folder -------------------------------------------------------------------------------
def test_a_second_run_with_the_same_name_is_refused_naming_the_holder(finished_run, tmp_path):
    """Two `rlkit train` with the same name= both exited 0 and one run was lost: a live holder refuses the second."""
    import os
    import socket
    import subprocess
    import sys
    import time

    from rlkit.errors import RunFolderError

    folder, cfg = copy_run(finished_run, tmp_path)
    holder = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        started = time.time() + 2  # after the holder's start, as a lock written by it would say
        (folder / ".lock").write_text(json.dumps({"pid": holder.pid, "host": socket.gethostname(),
                                                  "started": started, "command": "rlkit train run.yaml"}))
        before = digests(folder)
        with pytest.raises(RunFolderError) as info:
            run_experiment(cfg, progress=False, resume=True)
        when = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(started))
        assert str(info.value) == (
            f"run folder {str(folder)!r} is in use by another run: pid {holder.pid} on {socket.gethostname()}, started "
            f"{when} (rlkit train run.yaml). A second run with the same name would overwrite its records. Fix: give "
            "this run another name (name=...), wait for that run to end, or, if it is no longer running, delete "
            f"{str(folder / '.lock')!r}")
        assert digests(folder) == before
    finally:
        holder.kill()
        holder.wait()
    # the holder is gone: its lock is stale, taken over with a note, and released when the run ends
    with pytest.warns(UserWarning, match=rf"took over the lock of a run that is no longer running \(pid {holder.pid} "):
        summary = run_experiment(cfg, progress=False, resume=True)
    assert summary["resumed_from_step"] == 4 and not (folder / ".lock").exists()
    assert os.getpid() != holder.pid


# ---- resume with another config ------------------------------------------------------------------------------
def test_a_resume_with_changed_settings_is_refused_listing_them_unless_allowed(finished_run, tmp_path, capsys):
    folder, cfg = copy_run(finished_run, tmp_path, **{"grpo.num_generations_per_prompt": 8,
                                                      "policy.optimizer.lr": 1e-3})
    before = digests(folder)
    with pytest.raises(CheckpointError) as info:
        run_experiment(cfg, progress=False, resume=True)
    checkpoint = folder / "checkpoints" / "step_000004"
    assert str(info.value) == (
        f"resume from {checkpoint}: this config differs from the checkpoint's in 2 setting(s): "
        "grpo.num_generations_per_prompt: 4 -> 8; policy.optimizer.lr: 0.0003 -> 0.001. A resumed run would continue "
        "another experiment under this run's name. Fix: resume with the checkpoint's settings, or name the changes "
        "you mean: --allow-changes grpo.num_generations_per_prompt,policy.optimizer.lr "
        "(run_experiment(..., allow_changes=[...])); or start a new run under another name")
    assert digests(folder) == before

    config_path = tmp_path / "run.yaml"
    config_path.write_text(config_to_yaml(cfg))
    assert main(["train", str(config_path), "--quiet", "--resume", "--allow-changes", "policy.optimizer.lr"]) == 2
    assert "differs from the checkpoint's in 1 setting(s): grpo.num_generations_per_prompt: 4 -> 8" in capsys.readouterr().err
    with pytest.warns(UserWarning, match=r"resuming .*step_000004 with changed settings: "
                                         r"grpo.num_generations_per_prompt: 4 -> 8; policy.optimizer.lr: 0.0003 -> 0.001"):
        summary = run_experiment(cfg, progress=False, resume=True, allow_changes=["grpo", "policy.optimizer.lr"])
    assert summary["resumed_from_step"] == 4


# ---- SIGTERM -----------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("sigint", ["default", "ignored"])
def test_sigterm_stops_rlkit_train_like_ctrl_c_with_a_summary_and_a_nonzero_exit(finished_run, tmp_path, capsys,
                                                                                   monkeypatch, sigint):
    """SIGTERM (a scheduler's stop) ended a run at once with no summary.json. Sent here by the process to itself
    when step 6 is shown (a resumed run of 40 steps), as a scheduler would send it. ``ignored``: SIGINT ignored,
    as a shell script's background job (`nohup rlkit train ... &`) has it; SIGTERM, passed on as SIGINT, was then
    lost outside the blocks that hold Ctrl-C (a multi-turn run carried on past two SIGTERMs)."""
    import os
    import signal

    import rlkit.run.loop as loop

    previous_int = signal.getsignal(signal.SIGINT)
    if sigint == "ignored":
        signal.signal(signal.SIGINT, signal.SIG_IGN)

    folder, cfg = copy_run(finished_run, tmp_path, **{"grpo.max_num_steps": 40})
    config_path = tmp_path / "run.yaml"
    config_path.write_text(config_to_yaml(cfg))
    show = loop.show_progress

    def show_then_term(bar, metrics, with_kl):
        show(bar, metrics, with_kl)
        if metrics.step == 6:
            os.kill(os.getpid(), signal.SIGTERM)

    monkeypatch.setattr(loop, "show_progress", show_then_term)
    previous = signal.getsignal(signal.SIGTERM)
    try:
        assert main(["train", str(config_path), "--quiet", "--resume"]) == 143
    finally:
        signal.signal(signal.SIGINT, previous_int)
    assert signal.getsignal(signal.SIGTERM) == previous  # the CLI's handler is gone again
    assert "rlkit: stopped (SIGTERM): run() stopped after step 6" in capsys.readouterr().err
    summary = json.loads((folder / "summary.json").read_text())
    assert summary["stopped_early"].startswith("SIGTERM: run() stopped after step 6 (2 of 36 finished in this call)")
    assert summary["accuracy_after_rl"] is None and summary["resumed_from_step"] == 4
    assert [line["step"] for line in metric_lines(folder)][-2:] == [5, 6] or \
        [line["step"] for line in metric_lines(folder)][-1:] == [5]  # step 6's listeners (logging) may not have run
    assert not (folder / ".lock").exists()


@pytest.mark.parametrize("call, stage", [(1, "the warm start (SFT, then the evaluation before RL)"),
                                         (2, "the final evaluation")], ids=["warm_start", "final_evaluation"])
def test_sigterm_outside_the_rl_steps_writes_a_summary_saying_where(finished_run, tmp_path, capsys, monkeypatch,
                                                                     call, stage):
    """A stop during the warm start or the final evaluation (evaluate()'s first or second call) ended the run with
    no summary.json."""
    import os
    import signal

    from rlkit.session import Session

    cfg = load_config(finished_run.cfg.model_dump(mode="json"),
                      {"logger.log_dir": str(tmp_path / "runs"), "name": "stopped", "grpo.max_num_steps": 1})
    config_path = tmp_path / "run.yaml"
    config_path.write_text(config_to_yaml(cfg))
    evaluate, calls = Session.evaluate, []

    def term_on_the_chosen_call(self, *args, **kwargs):
        calls.append(1)
        if len(calls) == call:
            os.kill(os.getpid(), signal.SIGTERM)
        return evaluate(self, *args, **kwargs)

    monkeypatch.setattr(Session, "evaluate", term_on_the_chosen_call)
    assert main(["train", str(config_path), "--quiet"]) == 143
    assert "rlkit: stopped (SIGTERM)" in capsys.readouterr().err
    summary = json.loads((tmp_path / "runs" / "stopped" / "summary.json").read_text())
    assert summary["stopped_early"].startswith(f"SIGTERM during {stage}: ")
    assert summary["accuracy_after_rl"] is None and summary["rl_steps"] == call - 1
    assert (summary["accuracy_before_rl"] is None) == (call == 1)
    assert not (tmp_path / "runs" / "stopped" / ".lock").exists()


# ---- a read-only log dir, a full disk ------------------------------------------------------------------------------
@pytest.fixture
def mounted(tmp_path):
    """Mount a real tmpfs (read-only, or of a given size) under tmp_path; skipped where mounting is not permitted."""
    import subprocess

    mounts = []

    def mount(name, options):
        point = tmp_path / name
        point.mkdir()
        if subprocess.run(["mount", "-t", "tmpfs", "-o", options, "tmpfs", str(point)], capture_output=True).returncode:
            pytest.skip("mounting a tmpfs is not permitted here")
        mounts.append(point)
        return point

    yield mount
    for point in mounts:  # lazily where a file the run left open keeps it busy (else pytest cannot remove tmp_path)
        if subprocess.run(["umount", str(point)], capture_output=True).returncode:
            subprocess.run(["umount", "-l", str(point)], capture_output=True)


def test_a_read_only_log_dir_is_a_clear_error_naming_the_path_and_the_fix(finished_run, mounted):
    from rlkit.errors import RunFolderError

    read_only = mounted("ro", "ro,size=1m")
    cfg = load_config(finished_run.cfg.model_dump(mode="json"), {"logger.log_dir": str(read_only),
                                                                 "checkpointing.enabled": False})
    with pytest.raises(RunFolderError) as info:
        run_experiment(cfg, progress=False)
    run = read_only / "run"
    assert str(info.value) == (
        f"cannot write {str(run)!r}: the file system is read-only. Fix: make {str(run)!r} writable, or set "
        "logger.log_dir (and checkpointing.checkpoint_dir) to a folder you can write")


def test_a_disk_that_fills_during_a_run_is_a_clear_error_and_keeps_the_steps_logged(finished_run, mounted, monkeypatch):
    """The disk fills up after step 2 is shown (a filler file takes the rest of a 4 MB tmpfs): the error names
    the run folder it could not write in (a file's write() does not say which file) and the fix; the steps logged
    before are intact."""
    import rlkit.run.loop as loop
    from rlkit.errors import RunFolderError

    disk = mounted("disk", "size=4m")
    cfg = load_config(finished_run.cfg.model_dump(mode="json"), {
        "logger.log_dir": str(disk), "checkpointing.enabled": False, "logger.wandb_enabled": False})
    show = loop.show_progress

    def show_then_fill(bar, metrics, with_kl):
        show(bar, metrics, with_kl)
        if metrics.step == 2:
            with open(disk / "filler", "wb") as f:
                try:
                    while True:
                        f.write(b"\0" * 65536)
                        f.flush()
                except OSError:
                    pass

    monkeypatch.setattr(loop, "show_progress", show_then_fill)
    with pytest.raises(RunFolderError) as info:
        run_experiment(cfg, progress=False)
    assert str(info.value) == (f"cannot write {str(disk / 'run')!r}: the disk is full. Fix: free space there (or point "
                               "logger.log_dir and checkpointing.checkpoint_dir at a disk with room), then continue "
                               "with rlkit train ... --resume: the steps logged so far and the last checkpoint are kept")
    (disk / "filler").unlink()
    logged = [line for line in (disk / "run" / "metrics.jsonl").read_text().splitlines() if line.endswith("}")]
    assert [json.loads(line)["step"] for line in logged][:2] == [0, 1]
