"""A whole experiment from a config: SFT warm start, held-out evaluation, GRPO steps, evaluation again.

``rlkit train`` and sweeps call :func:`run_experiment`; a notebook can too. It writes
``<log_dir>/<name>/metrics.jsonl`` (one JSON object per step), ``config.yaml`` and ``summary.json``, and
with ``checkpointing.enabled`` periodic checkpoints that ``rlkit train ... --resume`` continues from; with
``export`` (``rlkit train ... --export DIR``) the trained policy as an HF model folder at the end.

What a failure leaves: a run that fails to start (a broken model folder, a damaged checkpoint) leaves the
run folder as it was, because the records are replaced only once the run has started
(:mod:`rlkit.tracking.records`); a step with non-finite gradients is skipped, and a run stopped by too many of
them in a row still writes its summary (:mod:`rlkit.run.skipped_steps`).

Deliberate simplification: a resumed run starts a new wandb run (same name and group); the JSONL files are
cut back to its checkpoint and continued.
"""

from __future__ import annotations

import contextlib
import json
import signal
import threading
import time
import warnings
from pathlib import Path
from typing import Any, Iterator, Optional, Sequence

from rlkit.config.changes import config_changes
from rlkit.config.loading import load_config
from rlkit.config.run import RunConfig
from rlkit.errors import CheckpointError, RunFolderError, SkippedStepsError
from rlkit.run.skipped_steps import skipped_so_far
from rlkit.session import Session
from rlkit.tracking.checkpoint import (checkpoint_folder, chosen_checkpoint, list_checkpoints, read_checkpoint_state,
                                       resumable_checkpoint, save_periodic, set_aside_newer)
from rlkit.tracking.lock import is_disk_error, run_folder_lock, unwritable
from rlkit.tracking.records import RunRecorder


def run_experiment(config: RunConfig, session: Optional[Session] = None, progress: bool = True,
                   run_dir: Optional[str | Path] = None, resume: bool = False,
                   resume_from: Optional[str | int | Path] = None, allow_changes: Sequence[str] = (),
                   export: Optional[str | Path] = None) -> dict[str, Any]:
    """Run ``config`` end to end and return the summary (also written to ``summary.json``).

    With ``export`` a run that completes writes the trained policy there as an HF model folder after the final
    evaluation (:meth:`rlkit.Session.export_hf`: transformers and vLLM load it; with adapters the weights are
    merged and ``adapter/`` holds the PEFT adapter folder), atomically, replacing a folder already there; the
    summary's ``export`` is its absolute path (None without ``export``, or when the run stopped early).

    With ``checkpointing.enabled`` a checkpoint is written after the SFT warm start (``step_000000``) and
    every ``save_period`` RL steps (and after the last), keeping the newest ``keep_last``; a fresh start over
    a run that has checkpoints is refused (it would mix its checkpoints with the old run's). With ``resume``
    the run continues from the newest checkpoint that reads whole in the run's checkpoint folder (and starts
    afresh when there is none); ``resume_from`` picks one (a step number of this run's checkpoints or a
    checkpoint folder). A resumed run skips SFT, keeps the logged steps up to its checkpoint, sets aside the
    run's checkpoints newer than it (:func:`rlkit.tracking.checkpoint.set_aside_newer`), and runs the RL
    steps left up to ``grpo.max_num_steps``, with the same metrics an uninterrupted run logs.

    The run's records are replaced only once the session is built and the checkpoint loaded
    (:mod:`rlkit.tracking.records`): a run that fails to start leaves the folder as it was. When ``run()``
    stops on too many skipped steps (SkippedStepsError), the summary is still written (``stopped_early``)
    before the error propagates.

    One process per run folder (:mod:`rlkit.tracking.lock`): a run whose folder another live run holds is refused
    (RunFolderError naming the holder). A resume compares the checkpoint's config with ``config`` and refuses any
    difference (listed, old -> new) that ``allow_changes`` (dotted keys or sections) does not name; the
    run's length (``grpo.max_num_steps``), ``logger.*`` and ``checkpointing.*`` may always change. A stop
    (Ctrl-C, or SIGTERM under ``rlkit train``: :func:`sigterm_as_interrupt`) during the RL steps ends the step
    as ``Session.run`` does, writes the summary with the reason (``stopped_early``; no final evaluation) and
    re-raises; a stop during the warm start (SFT, the evaluation before RL) or the final evaluation writes the
    summary saying so, too. A write that fails for want of room or permission is a RunFolderError naming the path
    and the fix.
    """
    run_dir = Path(run_dir or Path(config.logger.log_dir) / config.name)
    with run_folder_lock(run_dir):
        try:
            return _run(config, session, progress, run_dir, resume, resume_from, allow_changes, export)
        except OSError as error:
            if is_disk_error(error) and not isinstance(error, RunFolderError):
                raise unwritable(error, run_dir) from error
            raise


def _run(config: RunConfig, session: Optional[Session], progress: bool, run_dir: Path, resume: bool,
         resume_from: Optional[str | int | Path], allow_changes: Sequence[str],
         export: Optional[str | Path]) -> dict[str, Any]:
    t0 = time.perf_counter()
    ckpt_cfg, ckpt_dir = config.checkpointing, checkpoint_folder(config, run_dir)
    start = _resume_point(config, ckpt_dir, resume, resume_from)
    if start is not None:
        check_resume_changes(start, config, allow_changes)
    if start is not None and session is not None:
        raise ValueError("a resumed run builds its session from the checkpoint; do not pass session= as well")
    own_session, resumed_step = session is None, None
    try:
        if start is not None:
            session = Session.load(start, config=config)  # with the environment the checkpoint was made with
            state = read_checkpoint_state(start)
            resumed_step = state["run_state"]["step"]
            warm_start = state["extra"].get("warm_start") or NO_WARM_START  # none if saved by hand
        session = session or Session(config)
        # the run has started: from here on its records are this run's, written as the session's steps and
        # evaluations happen (the same records a notebook session writes after log_to())
        session.stop_logging()  # records a notebook had started on this session end here
        session.records = RunRecorder(run_dir, config, resumed_step)
        if resumed_step is not None:
            for moved in set_aside_newer(ckpt_dir, resumed_step):
                warnings.warn(f"{moved.name.split('.')[0]} is newer than the checkpoint this run resumes from; "
                              f"kept as {moved}", stacklevel=2)
        setup_s = time.perf_counter() - t0

        def save(path: Path) -> Path:  # the run's checkpoints keep the warm start's figures beside the session
            return session.save(path, {"warm_start": warm_start})

        def stopped_early(stop: KeyboardInterrupt, warm: dict[str, Any], history: list[Any], where: str = "",
                          rl_s: float = 0.0) -> None:
            """A stop: the summary (no final evaluation) says where, then the stop goes on."""
            reason = f"{_STOP['signal'] or 'interrupted (Ctrl-C)'}{f' during {where}' if where else ''}: {stop}"
            _write_summary(run_dir, _summary(config, warm, None, history, resumed_step, setup_s, rl_s,
                                             time.perf_counter() - t0), reason)

        if start is None:
            try:
                warm_start = _warm_start(session, config, progress)
            except KeyboardInterrupt as stop:
                stopped_early(stop, NO_WARM_START, [], "the warm start (SFT, then the evaluation before RL)")
                raise
            if ckpt_cfg.enabled:
                save_periodic(save, ckpt_dir, session.step_count, ckpt_cfg.keep_last)
        total = config.grpo.max_num_steps

        def on_step(metrics):  # timed parts of the next step's record (see Session.run); the session logged it
            if ckpt_cfg.enabled and (metrics.step % ckpt_cfg.save_period == 0 or metrics.step == total):
                with session.timed("checkpoint"):
                    save_periodic(save, ckpt_dir, session.step_count, ckpt_cfg.keep_last)

        t_rl, steps_before, stopped = time.perf_counter(), session.step_count, None
        try:
            session.run(max(0, total - session.step_count) if start else total, progress=progress, on_step=on_step)
        except (SkippedStepsError, KeyboardInterrupt) as error:  # KeyboardInterrupt: a stop, after a whole step
            stopped = error
        rl_s = time.perf_counter() - t_rl
        history = session.history if start else session.history[steps_before:]
        if isinstance(stopped, KeyboardInterrupt):  # a stop ends the run now: no final evaluation
            stopped_early(stopped, warm_start, history, rl_s=rl_s)
            raise stopped
        try:
            after = session.evaluate()  # logged at the last step, as the warm start's evaluation is at step 0
        except KeyboardInterrupt as stop:
            stopped_early(stop, warm_start, history, "the final evaluation")
            raise
        exported = None if export is None or stopped is not None else session.export_hf(export).resolve()
        summary = _summary(config, warm_start, after, history, resumed_step, setup_s, rl_s, time.perf_counter() - t0,
                           exported)
        _write_summary(run_dir, summary, None if stopped is None else str(stopped))
        if stopped is not None:
            raise stopped
        return summary
    finally:
        if session is not None:
            session.stop_logging()
            if own_session:
                session.close()


def _resume_point(config: RunConfig, ckpt_dir: Path, resume: bool,
                  resume_from: Optional[str | int | Path]) -> Optional[Path]:
    """The checkpoint the run continues from (None: a fresh start), chosen before anything is built or written.
    A fresh start with checkpointing over a folder that already holds checkpoints is refused."""
    if resume_from is not None:
        return chosen_checkpoint(ckpt_dir, resume_from)
    if resume:
        return resumable_checkpoint(ckpt_dir)
    existing = list_checkpoints(ckpt_dir)
    if config.checkpointing.enabled and existing:
        raise CheckpointError(
            f"{ckpt_dir} already holds checkpoints of a run named {config.name!r} "
            f"({', '.join(p.name for p in existing)}), "
            "and a fresh start would mix its own with them. Fix: continue that run (rlkit train ... --resume, or "
            "--resume-from STEP), give this run another name (name=...), or move those checkpoints away")
    return None


def _summary(config: RunConfig, warm_start: dict[str, Any], after: Any, history: list[Any],
             resumed_step: Optional[int], setup_s: float, rl_s: float, wall_s: float,
             exported: Optional[Path] = None) -> dict[str, Any]:
    before_acc = warm_start["accuracy_before_rl"]
    return {
        "name": config.name,
        "held_out_prompts": None if after is None else after.num_prompts,
        "accuracy_before_rl": before_acc,
        "accuracy_after_rl": None if after is None else after.accuracy,
        "accuracy_gain_points": None if before_acc is None or after is None else 100 * (after.accuracy - before_acc),
        "rl_steps": len(history),
        "skipped_steps": skipped_so_far(history),
        "sft_steps": warm_start["sft_steps"],
        "sft_final_loss": warm_start["sft_final_loss"],
        "reward_first_10_steps": _mean([m["rollout/reward_mean"] for m in history[:10]]),
        "reward_last_10_steps": _mean([m["rollout/reward_mean"] for m in history[-10:]]),
        "resumed_from_step": resumed_step,
        "seconds_setup": setup_s,
        "seconds_sft": warm_start["seconds_sft"],
        "seconds_rl": rl_s,
        "wall_time_s": wall_s,
        "export": None if exported is None else str(exported),  # the HF folder of the trained policy (export=)
    }


NO_WARM_START = dict(accuracy_before_rl=None, sft_steps=0, sft_final_loss=None, seconds_sft=0.0)  # none was made


def _warm_start(session: Session, config: RunConfig, progress: bool) -> dict[str, Any]:
    """SFT (if enabled), then held-out accuracy before RL (the session logs it at step 0); what a resumed run
    reports."""
    sft_result = session.sft(progress=progress) if config.sft.enabled and config.sft.num_steps else None
    before = session.evaluate()
    return {"accuracy_before_rl": before.accuracy,
            "sft_steps": len(sft_result.losses) if sft_result else 0,
            "sft_final_loss": sft_result.losses[-1] if sft_result else None,
            "seconds_sft": sft_result.seconds if sft_result else 0.0}


def _write_summary(run_dir: Path, summary: dict[str, Any], stopped: Optional[str]) -> None:
    summary["stopped_early"] = stopped
    (run_dir / "summary.json").write_text(json.dumps(summary, indent=2))


# ---- resume: the checkpoint's config against this one ----------------------------------------------------------
ALWAYS_ALLOWED = ("grpo.max_num_steps", "logger", "checkpointing")  # the run's length and where it writes


def check_resume_changes(checkpoint: Path, config: RunConfig, allow_changes: Sequence[str]) -> dict[str, tuple]:
    """Refuse to resume ``checkpoint`` under ``config`` when a setting changed that ``allow_changes`` does not name
    (a key or a section); warn listing the allowed ones. Why: a resume with another group size, loss, learning
    rate or dataset continues a different experiment under the old one's name and curves, silently."""
    saved = load_config(str(checkpoint / "config.yaml"))
    allowed = tuple(k.strip() for k in allow_changes if k.strip()) + ALWAYS_ALLOWED
    under = lambda key, sections: any(key == s or key.startswith(s + ".") for s in sections)  # noqa: E731
    changes = {k: v for k, v in config_changes(saved, config).items() if k != "name"}
    refused = {k: v for k, v in changes.items() if not under(k, allowed)}
    if refused:
        lines = "; ".join(f"{k}: {old!r} -> {new!r}" for k, (old, new) in refused.items())
        raise CheckpointError(
            f"resume from {checkpoint}: this config differs from the checkpoint's in {len(refused)} setting(s): "
            f"{lines}. A resumed run would continue another experiment under this run's name. Fix: resume with the "
            f"checkpoint's settings, or name the changes you mean: --allow-changes {','.join(refused)} "
            "(run_experiment(..., allow_changes=[...])); or start a new run under another name")
    shown = {k: v for k, v in changes.items() if not under(k, ALWAYS_ALLOWED)}
    if shown:
        warnings.warn(f"resuming {checkpoint} with changed settings: "
                      + "; ".join(f"{k}: {old!r} -> {new!r}" for k, (old, new) in shown.items()), stacklevel=3)
    return changes


# ---- SIGTERM ------------------------------------------------------------------------------------------------
_STOP = {"signal": None}


@contextlib.contextmanager
def sigterm_as_interrupt() -> Iterator[None]:
    """For the block (``rlkit train`` and ``rlkit sweep``), SIGTERM is a Ctrl-C: it is re-raised as SIGINT, so
    whatever holds Ctrl-C over a block that must not be cut (an optimizer update, a weight load:
    ``defer_keyboard_interrupt``) holds it too, and ``Session.run`` ends the step as a stop does. Why: a
    scheduler (Slurm, Kubernetes) stops a job with SIGTERM, which otherwise ends the process at once with no
    summary. Where SIGINT is ignored (a shell starts a background job so), SIGTERM raises KeyboardInterrupt
    itself outside the held blocks. Main thread only (where signals arrive)."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def on_term(signum: int, frame: Any) -> None:
        _STOP["signal"] = "SIGTERM"
        if callable(signal.getsignal(signal.SIGINT)):  # Python's Ctrl-C, or a block holding it
            signal.raise_signal(signal.SIGINT)
        else:  # SIGINT ignored (a background job of a shell script: `rlkit train ... &`), so raising it would do
            raise KeyboardInterrupt  # nothing; no block holds Ctrl-C now (those install a handler), so stop here

    previous = signal.signal(signal.SIGTERM, on_term)
    _STOP["signal"] = None
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


def stop_signal() -> Optional[str]:
    """"SIGTERM" if the last stop under :func:`sigterm_as_interrupt` came from SIGTERM, else None."""
    return _STOP["signal"]


def _mean(values: list[float]) -> Optional[float]:
    return sum(values) / len(values) if values else None
