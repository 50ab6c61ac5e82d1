"""A whole experiment from a config: SFT warm start, held-out evaluation, GRPO steps, evaluation again.

``rlkit train`` and sweeps call :func:`run_experiment`; a notebook can too. It writes
``<log_dir>/<name>/metrics.jsonl`` (one JSON object per step), ``config.yaml`` and ``summary.json``, and
with ``checkpointing.enabled`` periodic checkpoints that ``rlkit train ... --resume`` continues from.

What a failure leaves: a run that fails to start (a broken model folder, a damaged checkpoint) leaves the
run folder as it was, because the records are replaced only once the run has started
(:mod:`rlkit.tracking.records`); a step with non-finite gradients is skipped, and a run stopped by too many of
them in a row still writes its summary (:mod:`rlkit.stages.skipped_steps`).

Deliberate simplification: a resumed run starts a new wandb run (same name and group); the JSONL files are
cut back to its checkpoint and continued.
"""

from __future__ import annotations

import json
import time
import warnings
from pathlib import Path
from typing import Any, Optional

from rlkit.config.loading import config_to_yaml
from rlkit.config.run import RunConfig
from rlkit.errors import CheckpointError, SkippedStepsError
from rlkit.notebook.display import SAMPLE_COLUMNS, sample_rows
from rlkit.stages.skipped_steps import skipped_so_far
from rlkit.tracking import build_logger
from rlkit.tracking.records import start_records


def checkpoint_folder(config: RunConfig, run_dir: Optional[str | Path] = None) -> Path:
    """Where the run's periodic checkpoints go: ``checkpointing.checkpoint_dir`` or ``<run_dir>/checkpoints``."""
    if config.checkpointing.checkpoint_dir:
        return Path(config.checkpointing.checkpoint_dir)
    return Path(run_dir or Path(config.logger.log_dir) / config.name) / "checkpoints"


def run_experiment(config: RunConfig, session: Any = None, progress: bool = True,
                   run_dir: Optional[str | Path] = None, resume: bool = False,
                   resume_from: Optional[str | int | Path] = None) -> dict[str, Any]:
    """Run ``config`` end to end and return the summary (also written to ``summary.json``).

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
    """
    from rlkit.session import Session
    from rlkit.tracking.checkpoint import load_session, read_checkpoint_state, save_periodic, set_aside_newer

    t0 = time.perf_counter()
    run_dir = Path(run_dir or Path(config.logger.log_dir) / config.name)
    ckpt_cfg, ckpt_dir = config.checkpointing, checkpoint_folder(config, run_dir)
    start = _resume_point(config, ckpt_dir, resume, resume_from)
    if start is not None and session is not None:
        raise ValueError("a resumed run builds its session from the checkpoint; do not pass session= as well")
    own_session, logger, resumed_step = session is None, None, None
    try:
        if start is not None:
            session = load_session(Session, start, config=config)
            state = read_checkpoint_state(start)
            resumed_step = state["run_state"]["step"]
            warm_start = state["extra"].get("warm_start") or dict(  # none if saved by hand
                accuracy_before_rl=None, sft_steps=0, sft_final_loss=None, seconds_sft=0.0)
        session = session or Session(config)
        # the run has started: from here on its records are this run's
        start_records(run_dir, config_to_yaml(config), resumed_step)
        if resumed_step is not None:
            for moved in set_aside_newer(ckpt_dir, resumed_step):
                warnings.warn(f"{moved.name.split('.')[0]} is newer than the checkpoint this run resumes from; "
                              f"kept as {moved}", stacklevel=2)
        logger = build_logger(config.logger, run_dir, config.name, config.model_dump(mode="json"))
        setup_s = time.perf_counter() - t0
        if start is None:
            warm_start = _warm_start(session, config, logger, progress)
            if ckpt_cfg.enabled:
                save_periodic(session, ckpt_dir, ckpt_cfg.keep_last, {"warm_start": warm_start})
        period = config.logger.sample_table_period
        total = config.grpo.max_num_steps

        def on_step(metrics):  # timed parts of the next step's record (see Session.run)
            with session.timed("logging"):
                logger.log(metrics.values, step=metrics.step)
            if period and metrics.step % period == 0 and session.batch is not None:
                with session.timed("tables"):
                    logger.log_table("rollout/samples", SAMPLE_COLUMNS, sample_rows(session.batch, 8), metrics.step)
            if ckpt_cfg.enabled and (metrics.step % ckpt_cfg.save_period == 0 or metrics.step == total):
                with session.timed("checkpoint"):
                    save_periodic(session, ckpt_dir, ckpt_cfg.keep_last, {"warm_start": warm_start})

        t_rl, steps_before, stopped = time.perf_counter(), session.step_count, None
        try:
            session.run(max(0, total - session.step_count) if start else total, progress=progress, on_step=on_step)
        except SkippedStepsError as error:
            stopped = error
        rl_s = time.perf_counter() - t_rl
        after = session.evaluate()
        logger.log({"validation/accuracy": after.accuracy}, step=session.step_count)
        history = session.history if start else session.history[steps_before:]
        summary = _summary(config, warm_start, after, history, resumed_step, setup_s, rl_s, time.perf_counter() - t0)
        summary["stopped_early"] = None if stopped is None else str(stopped)
        (run_dir / "summary.json").write_text(json.dumps(summary, indent=2))
        if stopped is not None:
            raise stopped
        return summary
    finally:
        if logger is not None:
            logger.finish()
        if own_session and session is not None:
            session.close()


def _resume_point(config: RunConfig, ckpt_dir: Path, resume: bool,
                  resume_from: Optional[str | int | Path]) -> Optional[Path]:
    """The checkpoint the run continues from (None: a fresh start), chosen before anything is built or written.
    A fresh start with checkpointing over a folder that already holds checkpoints is refused."""
    from rlkit.tracking.checkpoint import chosen_checkpoint, list_checkpoints, resumable_checkpoint

    if resume_from is not None:
        return chosen_checkpoint(ckpt_dir, resume_from)
    if resume:
        return resumable_checkpoint(ckpt_dir)
    existing = list_checkpoints(ckpt_dir)
    if config.checkpointing.enabled and existing:
        raise CheckpointError(
            f"{ckpt_dir} already holds checkpoints of a run named {config.name!r} ({', '.join(p.name for p in existing)}), "
            "and a fresh start would mix its own with them. Fix: continue that run (rlkit train ... --resume, or "
            "--resume-from STEP), give this run another name (name=...), or move those checkpoints away")
    return None


def _summary(config: RunConfig, warm_start: dict[str, Any], after: Any, history: list[Any],
             resumed_step: Optional[int], setup_s: float, rl_s: float, wall_s: float) -> dict[str, Any]:
    before_acc = warm_start["accuracy_before_rl"]
    return {
        "name": config.name,
        "held_out_prompts": after.num_prompts,
        "accuracy_before_rl": before_acc,
        "accuracy_after_rl": after.accuracy,
        "accuracy_gain_points": None if before_acc is None else 100 * (after.accuracy - before_acc),
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
    }


def _warm_start(session: Any, config: RunConfig, logger: Any, progress: bool) -> dict[str, Any]:
    """SFT (if enabled), then held-out accuracy before RL, logged at step 0; what a resumed run reports."""
    sft_result = session.sft(progress=progress) if config.sft.enabled and config.sft.num_steps else None
    before = session.evaluate()
    logger.log({"validation/accuracy": before.accuracy}, step=0)
    return {"accuracy_before_rl": before.accuracy,
            "sft_steps": len(sft_result.losses) if sft_result else 0,
            "sft_final_loss": sft_result.losses[-1] if sft_result else None,
            "seconds_sft": sft_result.seconds if sft_result else 0.0}


def _mean(values: list[float]) -> Optional[float]:
    return sum(values) / len(values) if values else None
