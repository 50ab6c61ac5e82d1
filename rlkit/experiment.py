"""A whole experiment from a config: SFT warm start, held-out evaluation, GRPO steps, evaluation again.

``rlkit train`` and sweeps call :func:`run_experiment`; a notebook can too. It writes
``<log_dir>/<name>/metrics.jsonl`` (one JSON object per step), ``config.yaml`` and ``summary.json``, and
with ``checkpointing.enabled`` periodic checkpoints that ``rlkit train ... --resume`` continues from.

Deliberate simplification: a resumed run starts a new wandb run (same name and group); the JSONL files are
continued in place.
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any, Optional

from rlkit.config.loading import config_to_yaml
from rlkit.config.run import RunConfig
from rlkit.tracking import build_logger


def sample_rows(batch: Any, limit: int = 8) -> list[list[Any]]:
    rewards = batch.rewards.tolist() if batch.rewards is not None else [None] * batch.batch_size
    adv = batch.advantages.sum(1).div(batch.loss_mask.sum(1).clamp(min=1)).tolist() if batch.advantages is not None \
        else [None] * batch.batch_size
    return [[batch.prompts[i], batch.completions[i], rewards[i], adv[i], int(batch.completion_lengths[i]),
             batch.finish_reasons[i]] for i in range(min(limit, batch.batch_size))]


SAMPLE_COLUMNS = ["prompt", "completion", "reward", "advantage", "length", "finish_reason"]


def checkpoint_folder(config: RunConfig, run_dir: Optional[str | Path] = None) -> Path:
    """Where the run's periodic checkpoints go: ``checkpointing.checkpoint_dir`` or ``<run_dir>/checkpoints``."""
    if config.checkpointing.checkpoint_dir:
        return Path(config.checkpointing.checkpoint_dir)
    return Path(run_dir or Path(config.logger.log_dir) / config.name) / "checkpoints"


def _truncate_jsonl(path: Path, last_step: int) -> None:
    """Drop the lines logged after ``last_step`` (steps a killed run logged past its last checkpoint;
    ``-1``: all of them, for a fresh start)."""
    if not path.is_file():
        return
    if last_step < 0:
        path.unlink()
        return
    kept = [line for line in path.read_text().splitlines() if line.strip() and json.loads(line)["step"] <= last_step]
    tmp = path.with_suffix(".tmp")
    tmp.write_text("".join(line + "\n" for line in kept))
    tmp.replace(path)


def run_experiment(config: RunConfig, session: Any = None, progress: bool = True,
                   run_dir: Optional[str | Path] = None, resume: bool = False) -> dict[str, Any]:
    """Run ``config`` end to end and return the summary (also written to ``summary.json``).

    With ``checkpointing.enabled`` a checkpoint is written after the SFT warm start (``step_000000``) and
    every ``save_period`` RL steps (and after the last), keeping the newest ``keep_last``. With ``resume``
    the run continues from the newest checkpoint in the run's checkpoint folder (and starts afresh when
    there is none): SFT is skipped, ``metrics.jsonl`` keeps the steps up to the checkpoint, and the RL
    steps left up to ``grpo.max_num_steps`` are run, with the same metrics an uninterrupted run logs.
    """
    from rlkit.session import Session
    from rlkit.tracking.checkpoint import latest_checkpoint, load_session, read_checkpoint_state, save_periodic

    t0 = time.perf_counter()
    run_dir = Path(run_dir or Path(config.logger.log_dir) / config.name)
    run_dir.mkdir(parents=True, exist_ok=True)
    ckpt_cfg, ckpt_dir = config.checkpointing, checkpoint_folder(config, run_dir)
    start = latest_checkpoint(ckpt_dir) if resume else None
    if start is not None and session is not None:
        raise ValueError("resume=True builds its session from the checkpoint; do not pass session= as well")
    (run_dir / "config.yaml").write_text(config_to_yaml(config))
    for name in ("metrics.jsonl", "tables.jsonl"):  # a resumed run keeps what was logged up to its checkpoint
        _truncate_jsonl(run_dir / name, -1 if start is None else int(start.name.split("_")[-1]))
    own_session = session is None
    logger = build_logger(config.logger, run_dir, config.name, config.model_dump(mode="json"))
    try:
        if start is not None:
            session = load_session(Session, start, config=config)
            warm_start = read_checkpoint_state(start)["extra"].get("warm_start") or dict(  # none if saved by hand
                accuracy_before_rl=None, sft_steps=0, sft_final_loss=None, seconds_sft=0.0)
        session = session or Session(config)
        setup_s = time.perf_counter() - t0
        if start is None:
            warm_start = _warm_start(session, config, logger, progress)
            if ckpt_cfg.enabled:
                save_periodic(session, ckpt_dir, ckpt_cfg.keep_last, {"warm_start": warm_start})
        period = config.logger.sample_table_period
        total = config.grpo.max_num_steps

        def on_step(metrics):
            logger.log(metrics.values, step=metrics.step)
            if period and metrics.step % period == 0 and session.batch is not None:
                logger.log_table("rollout/samples", SAMPLE_COLUMNS, sample_rows(session.batch), metrics.step)
            if ckpt_cfg.enabled and (metrics.step % ckpt_cfg.save_period == 0 or metrics.step == total):
                save_periodic(session, ckpt_dir, ckpt_cfg.keep_last, {"warm_start": warm_start})

        t_rl = time.perf_counter()
        done = session.run(max(0, total - session.step_count) if start else total, progress=progress, on_step=on_step)
        rl_s = time.perf_counter() - t_rl
        after = session.evaluate()
        logger.log({"validation/accuracy": after.accuracy}, step=session.step_count)
        history, before_acc = session.history if start else done, warm_start["accuracy_before_rl"]
        summary = {
            "name": config.name,
            "held_out_prompts": after.num_prompts,
            "accuracy_before_rl": before_acc,
            "accuracy_after_rl": after.accuracy,
            "accuracy_gain_points": None if before_acc is None else 100 * (after.accuracy - before_acc),
            "rl_steps": len(history),
            "sft_steps": warm_start["sft_steps"],
            "sft_final_loss": warm_start["sft_final_loss"],
            "reward_first_10_steps": _mean([m["rollout/reward_mean"] for m in history[:10]]),
            "reward_last_10_steps": _mean([m["rollout/reward_mean"] for m in history[-10:]]),
            "resumed_from_step": None if start is None else int(start.name.split("_")[-1]),
            "seconds_setup": setup_s,
            "seconds_sft": warm_start["seconds_sft"],
            "seconds_rl": rl_s,
            "wall_time_s": time.perf_counter() - t0,
        }
        (run_dir / "summary.json").write_text(json.dumps(summary, indent=2))
        return summary
    finally:
        logger.finish()
        if own_session and session is not None:
            session.close()


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
