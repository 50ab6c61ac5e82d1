"""A whole experiment from a config: SFT warm start, held-out evaluation, GRPO steps, evaluation again.

``rlkit train`` and sweeps call :func:`run_experiment`; a notebook can too. It writes
``<log_dir>/<name>/metrics.jsonl`` (one JSON object per step), ``config.yaml`` and ``summary.json``.
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


def run_experiment(config: RunConfig, session: Any = None, progress: bool = True,
                   run_dir: Optional[str | Path] = None) -> dict[str, Any]:
    """Run ``config`` end to end and return the summary (also written to ``summary.json``)."""
    from rlkit.session import Session

    t0 = time.perf_counter()
    run_dir = Path(run_dir or Path(config.logger.log_dir) / config.name)
    run_dir.mkdir(parents=True, exist_ok=True)
    (run_dir / "config.yaml").write_text(config_to_yaml(config))
    (run_dir / "metrics.jsonl").unlink(missing_ok=True)
    logger = build_logger(config.logger, run_dir, config.name, config.model_dump(mode="json"))
    own_session = session is None
    session = session or Session(config)
    try:
        setup_s = time.perf_counter() - t0
        sft_result = session.sft(progress=progress) if config.sft.enabled and config.sft.num_steps else None
        before = session.evaluate()
        logger.log({"validation/accuracy": before.accuracy}, step=0)
        period = config.logger.sample_table_period

        def on_step(metrics):
            logger.log(metrics.values, step=metrics.step)
            if period and metrics.step % period == 0 and session.batch is not None:
                logger.log_table("rollout/samples", SAMPLE_COLUMNS, sample_rows(session.batch), metrics.step)

        t_rl = time.perf_counter()
        history = session.run(config.grpo.max_num_steps, progress=progress, on_step=on_step)
        rl_s = time.perf_counter() - t_rl
        after = session.evaluate()
        logger.log({"validation/accuracy": after.accuracy}, step=session.step_count)
        summary = {
            "name": config.name,
            "held_out_prompts": after.num_prompts,
            "accuracy_before_rl": before.accuracy,
            "accuracy_after_rl": after.accuracy,
            "accuracy_gain_points": 100 * (after.accuracy - before.accuracy),
            "rl_steps": len(history),
            "sft_steps": len(sft_result.losses) if sft_result else 0,
            "sft_final_loss": sft_result.losses[-1] if sft_result else None,
            "reward_first_10_steps": _mean([m["rollout/reward_mean"] for m in history[:10]]),
            "reward_last_10_steps": _mean([m["rollout/reward_mean"] for m in history[-10:]]),
            "seconds_setup": setup_s,
            "seconds_sft": sft_result.seconds if sft_result else 0.0,
            "seconds_rl": rl_s,
            "wall_time_s": time.perf_counter() - t0,
        }
        (run_dir / "summary.json").write_text(json.dumps(summary, indent=2))
        return summary
    finally:
        logger.finish()
        if own_session:
            session.close()


def _mean(values: list[float]) -> Optional[float]:
    return sum(values) / len(values) if values else None
