"""The loop over steps, ``Run.run(n)``: what goes on between one :meth:`rlkit.run.run.Run.step` and the next.

Why a module of its own: a step is the Run's (rollout to refit, one top-to-bottom read in :mod:`rlkit.run.run`);
the loop adds only what lies between steps, none of which a step needs: the progress bar, the validation every
``grpo.val_period`` steps and the reward-hacking check after it (:mod:`rlkit.run.reward_hacking`), the records
and the listeners, a skipped step (:mod:`rlkit.run.skipped_steps`) and when too many in a row end the run, a stop
request, and an interrupt that leaves the run consistent. It calls the Run's public methods only (``step()``,
``evaluate()``, ``refit()``, ``record_step()``), one way, as a notebook cell calling them in a loop would.

:func:`run_steps` is the Run's ``run`` method (``Run.run = run_steps``), not a wrapper around it, so a warning it
raises points at the same frame a method's would. Each step of the loop is timed on a step clock the loop holds
open over the bar and the evaluation (:mod:`rlkit.run.step_clock`): the listeners' seconds of one step go to the
next step's ``timing/``, and the last step's to its own record in the history when the loop ends.
"""

from __future__ import annotations

import time
import warnings
from typing import Any, Callable, Optional

from tqdm.auto import tqdm

from rlkit.errors import RunInterrupted
from rlkit.run import loop
from rlkit.run.metrics import StepMetrics
from rlkit.run.reward_hacking import FLAG as HACKING_FLAG, reward_hacking
from rlkit.run.skipped_steps import SKIPPED, refused_update, skipped_in_a_row, too_many_skipped
from rlkit.run.step_clock import StepClock


def run_steps(run: Any, steps: Optional[int] = None, progress: bool = True,
              on_step: Optional[Callable[[StepMetrics], None]] = None) -> list[StepMetrics]:
    """``steps`` RL steps of ``run`` (a :class:`rlkit.run.run.Run`; not imported here: it imports this module),
    default ``grpo.max_num_steps``, with a progress bar; see :meth:`rlkit.Session.run` for what a stop request, a
    skipped step and an interrupt do. Each step is recorded when the run records, then ``on_step`` and the
    listeners see it (their seconds go to the next step's ``timing/``)."""
    run.refuse_if_closed("run")
    total = run.config.grpo.max_num_steps if steps is None else steps
    run.state.stop_requested = False
    done: list[StepMetrics] = []
    bar = tqdm(total=total, desc=loop.algorithm_name(run.loss_fn, run.config), disable=not progress, leave=True)
    clock = run.clock = StepClock()
    try:
        for _ in range(total):
            version_before, t0 = run.policy.version, time.perf_counter()
            try:
                metrics = run.step()
            except Exception as error:
                refused = refused_update(error)
                if refused is None:
                    raise
                metrics = skip_step(run, refused, version_before, t0)
            done.append(metrics)
            with clock.part("progress"):
                loop.show_progress(bar, metrics, run.needs_reference)
            period = run.config.grpo.val_period
            if period and run.state.step % period == 0:
                with clock.part("eval"):
                    metrics.values["validation/accuracy"] = run.evaluate().accuracy
                if hacking := reward_hacking(run.state.history, run.config.eval.reward_hacking_drop):
                    metrics.values[HACKING_FLAG] = 1.0
                    warnings.warn(hacking, stacklevel=3)
            clock.finish(metrics.values)
            # recorded, then the listeners see the record, so their seconds go to the next one (timing/listeners,
            # logging, checkpoint...); the last step's are added to its record in history when the loop ends
            clock = run.clock = StepClock()
            with clock.part("listeners"):
                run.record_step(metrics)
                for listener in ([on_step] if on_step else []) + run.listeners:
                    listener(metrics)
            limit = run.config.grpo.max_consecutive_skipped_steps
            if SKIPPED in metrics.values and skipped_in_a_row(run.state.history) >= limit:
                raise too_many_skipped(limit, run.state.history, refused) from refused
            if run.state.stop_requested:
                break
    except KeyboardInterrupt:
        raise RunInterrupted(f"run() stopped after step {run.state.step} ({len(done)} of {total} finished in "
                             "this call); the session is consistent, the finished steps are in "
                             "session.history, and run() or step() carries on from here") from None
    finally:
        run.clock = None
        with clock.part("progress"):  # closing joins tqdm's monitor thread: milliseconds under load
            bar.close()
    if done:
        clock.add_to(done[-1].values)
    return done


def skip_step(run: Any, error: BaseException, version_before: int, t0: float) -> StepMetrics:
    """Record the step whose update the policy refused as a skipped step (:func:`rlkit.run.loop.skipped`); the
    generator is told the step is over (refit only if an earlier optimizer step of this RL step was applied)."""
    metrics = loop.skipped(run.state, run.policy.version, version_before, time.perf_counter() - t0, error,
                           run.config.grpo.max_consecutive_skipped_steps)
    if run.stale:
        run.refit()
    else:  # same weights: a refit would copy what the generator holds; async GRPO needs the step count
        run.rollouts.weights_loaded(run.generator_version, run.state.step)
    return metrics
