"""One whole RL step and the loop over steps, and how a step is recorded (``train()``'s update, its metrics, the
run state's next step): functions of the session, which holds ``step``, ``run``, ``request_stop`` and ``timed``
as its methods; its stage methods are the step's stages, its run state and rollout source (:mod:`rlkit.run`)
the record.

What the loop adds to a step: a progress bar, evaluation every ``grpo.val_period`` steps, the listeners (a
dashboard, the experiment's loggers and checkpoints), skipped steps (a step whose gradients are not finite is
recorded and the run goes on, :mod:`rlkit.stages.skipped_steps`), ``request_stop()`` between steps, and an
interrupt that reads as one line (:class:`rlkit.errors.RunInterrupted`). Its time is on the step clock too
(:mod:`rlkit.stages.step_clock`), so a step's ``timing/`` parts still add up.
"""

from __future__ import annotations

import time
import warnings
from contextlib import nullcontext
from typing import Any, Callable, ContextManager, Optional

from tqdm.auto import tqdm

from rlkit import stages
from rlkit.algorithms import RLLoss
from rlkit.errors import RunInterrupted
from rlkit.run import history
from rlkit.stages.metrics import StepMetrics, step_metrics
from rlkit.stages.reuse import warn_if_reused
from rlkit.stages.skipped_steps import SKIPPED, refused_update, skipped_in_a_row, skipped_step_metrics, too_many_skipped
from rlkit.stages.step_clock import StepClock
from rlkit.trajectories import Trajectories


def timed(session: Any, part: str) -> ContextManager[None]:
    """Time a block as part ``part`` of the step under way (a listener's checkpoint save); outside a
    ``step()``/``run()``, or in another thread, it times nothing (:mod:`rlkit.stages.step_clock`)."""
    clock = session._clock  # read once: async GRPO's producer thread calls this while the clock is replaced
    return clock.part(part) if clock is not None else nullcontext()


def request_stop(session: Any) -> None:
    """Ask ``run()`` to end after the step it is in (what the dashboard's stop button calls); no step is cut
    in half. The next ``run()`` starts without the request."""
    session.run_state.stop_requested = True


def step(session: Any) -> StepMetrics:
    """One whole RL step: rollout, score, logprobs, advantages, train, refit. Its ``timing/`` parts add up
    to ``timing/step_total``, the rest named ``timing/other`` (:mod:`rlkit.stages.step_clock`).

    Where the batch gets one update with rlkit's loss and no reference pass, the train step's own forward
    computes the batch's logprobs (the same values, bitwise here), and the separate pass is skipped:
    ``timing/logprobs`` is then 0 and the batch ends with ``prev_logprobs`` and ``entropy`` all the same."""
    session._refuse_if_closed("step")
    own_clock = session._clock is None  # run() keeps its own clock open over the progress bar and evaluation
    clock = session._clock = session._clock or StepClock()
    try:
        with clock.part("refit"):  # the weights of an update made outside step() (a cell's session.train())
            if session.stale:
                session.refit()
        with clock.part("rollout"):
            batch = session.rollout()
        with clock.part("score"):
            batch = session.score(batch)
        # logprobs before advantages: estimators that fold KL into the reward need the reference logprobs;
        # skipped where the train step computes the same values itself (skips_logprobs_pass)
        on_policy = skips_logprobs_pass(session, batch)
        if on_policy:
            clock.skipped("logprobs")
        else:
            with clock.part("logprobs"):
                batch = session.logprobs(batch)
            clock.split("logprobs", "reference_logprobs", batch.info.get("timing/reference_logprobs", 0.0))
        with clock.part("advantages"):
            batch = session.advantages(batch)
        with clock.part("train"):
            metrics = train(session, batch, allow_reuse=False, on_policy=on_policy)
        with clock.part("refit"):
            session.refit()
        with clock.part("metrics"):
            metrics.values.update(session.rollouts.step_timings())
            clock.samples, clock.tokens = batch.batch_size, float(batch.completion_lengths.sum())
        if own_clock:
            clock.finish(metrics.values)
    finally:
        if own_clock:
            session._clock = None
    return metrics


def refit_if_released(session: Any) -> None:
    """Before a rollout: an engine that released its weights for a train step (``policy.generation.vllm_cfg.
    release_weights_for_training``) has none until a refit, so a rollout after ``train()`` without ``refit()`` refits
    first, and warns: it then samples the policy's new weights, not the older ones a stale generator would."""
    if getattr(session.generator, "weights_released", False):
        warnings.warn("the engine released its weights for the train step (policy.generation.vllm_cfg."
                      "release_weights_for_training): refitting before this rollout, which is then on-policy")
        session.refit()


def release_engine_weights(session: Any) -> None:
    """Before the policy's passes (logprobs, train): a CPU engine that releases its weights for them (``policy.
    generation.vllm_cfg.release_weights_for_training``, the CPU's stand-in for sleep) does so; the refit after the
    update rebuilds them, and a rollout before it refits first (:func:`refit_if_released`)."""
    generator = session.generator
    if getattr(generator, "releases_weights_for_training", False) and not generator.weights_released:
        generator.release_weights()
        session.generator_version = -1  # no weights until the next refit


def train(session: Any, batch: Trajectories, allow_reuse: bool, on_policy: bool) -> StepMetrics:
    """:meth:`rlkit.Session.train`; ``on_policy``: the batch has no ``prev_logprobs`` and the train step's own
    forward fills them in, with the entropy and the mismatch figures (:func:`skips_logprobs_pass`)."""
    if not allow_reuse:
        warn_if_reused(batch, session.step_count)
    version_before, seed = session.policy.version, session.sampling().seed
    history.before_train(session)
    release_engine_weights(session)
    try:
        result = stages.train(batch, session.policy, session.loss_fn, session.settings.train,
                              seed=session.config.seed + session.step_count, on_policy=on_policy)
    except stages.TrainInterrupted as interrupted:
        _record_step(session, batch, interrupted.metrics(), interrupted.seconds, version_before)
        raise
    except BaseException:
        session.run_state.store.drop_snapshot(session.step_count + 1)
        raise
    if on_policy:
        batch = session.run_state.batch = stages.logprobs_from_train_step(
            batch, result.steps[0], version_before, session.config.grpo.mismatch_warning_threshold)
    session.run_state.last_train = result
    metrics = _record_step(session, batch, result.metrics, result.seconds, version_before)
    history.after_train(session, batch, metrics, version_before, seed)
    return metrics


def _record_step(session: Any, batch: Trajectories, train_metrics: dict[str, float], seconds: float,
                 version_before: int) -> StepMetrics:
    with session.timed("metrics"):
        metrics = step_metrics(session.step_count + 1, session.policy.version, batch, train_metrics,
                               {"train": seconds}, version_before)
        # the async producer's rollout/ figures, dynamic sampling's rounds (tries, kept and dropped groups)
        metrics.values.update({k: v for k, v in batch.info.items() if k.startswith(("rollout/", "dynamic_sampling/"))})
        session.run_state.end_step(metrics)
    return metrics


def skips_logprobs_pass(session: Any, batch: Trajectories) -> bool:
    """Whether ``step()`` can skip the logprobs pass and take the batch's logprobs from its train step
    (TRL's rule for on-policy steps): one update on the batch, so the step's own forward, at the weights
    the pass would use, computes exactly its values (bitwise here: tests/session/test_step_logprobs.py);
    rlkit's loss (a loss function of yours may read ``prev_logprobs`` itself); no reference pass needed; and
    a policy that returns them (not a Ray worker group, not Megatron with pipeline parallelism)."""
    return (isinstance(session.loss_fn, RLLoss) and not session.needs_reference
            and session.policy.returns_step_logprobs
            and stages.one_update(batch.batch_size, session.settings.train.num_epochs,
                                  session.settings.train.global_batch_size))


def run(session: Any, steps: Optional[int] = None, progress: bool = True,
        on_step: Optional[Callable[[StepMetrics], None]] = None) -> list[StepMetrics]:
    """``steps`` RL steps (default ``grpo.max_num_steps``) with a progress bar; ``request_stop()``
    (or the dashboard's stop button) ends the loop after the current step.

    A step whose gradients are not finite is skipped, not fatal (:mod:`rlkit.stages.skipped_steps`): its
    prompts are consumed, nothing is applied, its metrics carry ``train/skipped_steps`` (the count so far)
    and go to the listeners like any step's. After ``grpo.max_consecutive_skipped_steps`` skipped steps in a
    row it raises SkippedStepsError; the steps taken are in ``history``.

    Ctrl-C or Jupyter's stop button raises :class:`rlkit.errors.RunInterrupted`, one line saying after which
    step it stopped: the interrupted step either took effect whole (and is recorded) or not at all, the
    finished steps are in ``session.history`` (the return value is lost with the interrupt), and the next
    ``run()`` or ``step()`` carries on from there."""
    session._refuse_if_closed("run")

    total = session.config.grpo.max_num_steps if steps is None else steps
    session.run_state.stop_requested = False
    done = []
    bar = tqdm(total=total, desc=algorithm_name(session), disable=not progress, leave=True)
    clock = session._clock = StepClock()
    try:
        for _ in range(total):
            version_before, t0 = session.policy.version, time.perf_counter()
            try:
                metrics = session.step()
            except Exception as error:
                refused = refused_update(error)
                if refused is None:
                    raise
                metrics = _skip_step(session, refused, version_before, t0)
            done.append(metrics)
            with clock.part("progress"):
                _show_progress(session, bar, metrics)
            period = session.config.grpo.val_period
            if period and session.step_count % period == 0:
                with clock.part("eval"):
                    metrics.values["validation/accuracy"] = session.evaluate().accuracy
            clock.finish(metrics.values)
            # the listeners log this record, so their seconds go to the next one (timing/listeners, logging,
            # checkpoint...); the last step's are added to its record in history when the loop ends
            clock = session._clock = StepClock()
            with clock.part("listeners"):
                for listener in ([on_step] if on_step else []) + session.listeners:
                    listener(metrics)
            limit = session.config.grpo.max_consecutive_skipped_steps
            if SKIPPED in metrics.values and skipped_in_a_row(session.history) >= limit:
                raise too_many_skipped(limit, session.history, refused) from refused
            if session.stop_requested:
                break
    except KeyboardInterrupt:
        raise RunInterrupted(f"run() stopped after step {session.step_count} ({len(done)} of {total} finished in "
                             "this call); the session is consistent, the finished steps are in "
                             "session.history, and run() or step() carries on from here") from None
    finally:
        session._clock = None
        with clock.part("progress"):  # closing joins tqdm's monitor thread: milliseconds under load
            bar.close()
    if done:
        clock.add_to(done[-1].values)
    return done


def algorithm_name(session: Any) -> str:
    """What the progress bar calls the run: the policy loss when it names an algorithm of its own (GSPO), else the
    advantage estimator (GRPO, RLOO, ...); "RL" for a loss function of yours."""
    if not isinstance(session.loss_fn, RLLoss):
        return "RL"
    loss = session.config.loss_fn.policy_loss
    if not isinstance(loss, str):  # a policy-loss function of yours
        return getattr(loss, "__name__", "RL")
    if loss != "ppo_clip":
        return _NAMES.get(loss, loss.upper())
    return _NAMES.get(session.config.grpo.advantage_estimator, session.config.grpo.advantage_estimator.upper())


_NAMES = {"dr_grpo": "Dr. GRPO", "reinforce_pp": "REINFORCE++", "reinforce_baseline": "REINFORCE"}


def _show_progress(session: Any, bar: Any, metrics: StepMetrics) -> None:
    shown = {"reward": f"{metrics['rollout/reward_mean']:.3f}",
             "entropy": f"{metrics.get('train/approx_entropy', float('nan')):.3f}"}
    if session.needs_reference:
        shown["kl"] = f"{metrics.get('train/kl', 0.0):.4f}"
    bar.set_postfix(shown, refresh=False)
    bar.update(1)


def _skip_step(session: Any, error: BaseException, version_before: int, t0: float) -> StepMetrics:
    """Record the step whose update the policy refused as a skipped step: its prompts are consumed, its
    metrics are its batch's rollout metrics and ``train/skipped_steps``; the generator is told the step is
    over (refit only if an earlier optimizer step of this RL step was applied)."""
    metrics = skipped_step_metrics(session.step_count + 1, session.policy.version, session.batch,
                                   version_before, time.perf_counter() - t0, session.history)
    session.run_state.end_step(metrics)
    if session.stale:
        session.refit()
    else:  # same weights: a refit would copy what the generator holds; async GRPO needs the step count
        session.rollouts.weights_loaded(session.generator_version, session.step_count)
    warnings.warn(f"step {metrics.step} skipped ({error}); {metrics['train/skipped_steps']:.0f} skipped so far, "
                  f"stopping after {session.config.grpo.max_consecutive_skipped_steps} in a row "
                  "(grpo.max_consecutive_skipped_steps)", stacklevel=3)
    return metrics
