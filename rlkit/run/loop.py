"""``Session.step()`` and ``Session.run()``: one whole RL step, and the loop over steps that a notebook cell or
``rlkit train`` runs; and how a step is recorded (``train()``'s update, its metrics, the run state's next step).

What the loop adds to ``step()``: a progress bar, evaluation every ``grpo.val_period`` steps, the listeners (a
dashboard, the experiment's loggers and checkpoints), skipped steps (a step whose gradients are not finite is
recorded and the run goes on, :mod:`rlkit.stages.skipped_steps`), ``request_stop()`` between steps, and an
interrupt that reads as one line (:class:`rlkit.errors.RunInterrupted`). Its time is on the step clock too
(:mod:`rlkit.stages.step_clock`), so a step's ``timing/`` parts still add up. A mixin of
:class:`rlkit.session.Session`: the session's stage methods are its stages, and the run state and rollout
source (:mod:`rlkit.run`) its record; the session module stays the facade of stage calls.
"""

from __future__ import annotations

import time
import warnings
from contextlib import nullcontext
from typing import Any, Callable, ContextManager, Optional

from rlkit import stages
from rlkit.algorithms import RLLoss
from rlkit.errors import RunInterrupted
from rlkit.stages.metrics import StepMetrics, step_metrics
from rlkit.stages.reuse import warn_if_reused
from rlkit.stages.step_clock import StepClock
from rlkit.trajectories import Trajectories


class RunLoop:
    """``step()``, ``run()``, ``request_stop()`` and the step clock, over the session's stages."""

    _clock: Optional[StepClock] = None  # the step clock of the step under way in step() or run()

    def timed(self, part: str) -> ContextManager[None]:
        """Time a block as part ``part`` of the step under way (a listener's checkpoint save); outside a
        ``step()``/``run()``, or in another thread, it times nothing (:mod:`rlkit.stages.step_clock`)."""
        clock = self._clock  # read once: async GRPO's producer thread calls this while the clock is replaced
        return clock.part(part) if clock is not None else nullcontext()

    def step(self) -> StepMetrics:
        """One whole RL step: rollout, score, logprobs, advantages, train, refit. Its ``timing/`` parts add up
        to ``timing/step_total``, the rest named ``timing/other`` (:mod:`rlkit.stages.step_clock`).

        Where the batch gets one update with rlkit's loss and no reference pass, the train step's own forward
        computes the batch's logprobs (the same values, bitwise here), and the separate pass is skipped:
        ``timing/logprobs`` is then 0 and the batch ends with ``prev_logprobs`` and ``entropy`` all the same."""
        self._refuse_if_closed("step")
        own_clock = self._clock is None  # run() keeps its own clock open over the progress bar and evaluation
        clock = self._clock = self._clock or StepClock()
        try:
            with clock.part("refit"):  # the weights of an update made outside step() (a cell's session.train())
                if self.stale:
                    self.refit()
            with clock.part("rollout"):
                batch = self.rollout()
            with clock.part("score"):
                batch = self.score(batch)
            # logprobs before advantages: estimators that fold KL into the reward need the reference logprobs;
            # skipped where the train step computes the same values itself (_skips_logprobs_pass)
            on_policy = self._skips_logprobs_pass(batch)
            if on_policy:
                clock.skipped("logprobs")
            else:
                with clock.part("logprobs"):
                    batch = self.logprobs(batch)
                clock.split("logprobs", "reference_logprobs", batch.info.get("timing/reference_logprobs", 0.0))
            with clock.part("advantages"):
                batch = self.advantages(batch)
            with clock.part("train"):
                metrics = self._train(batch, allow_reuse=False, on_policy=on_policy)
            with clock.part("refit"):
                self.refit()
            with clock.part("metrics"):
                metrics.values.update(self.rollouts.step_timings())
                clock.samples, clock.tokens = batch.batch_size, float(batch.completion_lengths.sum())
            if own_clock:
                clock.finish(metrics.values)
        finally:
            if own_clock:
                self._clock = None
        return metrics

    def _train(self, batch: Trajectories, allow_reuse: bool, on_policy: bool) -> StepMetrics:
        """:meth:`train`; ``on_policy``: the batch has no ``prev_logprobs`` and the train step's own forward
        fills them in, with the entropy and the mismatch figures (:meth:`_skips_logprobs_pass`)."""
        if not allow_reuse:
            warn_if_reused(batch, self.step_count)
        version_before = self.policy.version
        try:
            result = stages.train(batch, self.policy, self.loss_fn, self.config.grpo.num_epochs,
                                  self.config.policy.train_global_batch_size, seed=self.config.seed + self.step_count,
                                  on_policy=on_policy)
        except stages.TrainInterrupted as interrupted:
            self._record_step(batch, interrupted.metrics(), interrupted.seconds, version_before)
            raise
        if on_policy:
            batch = self._keep(stages.logprobs_from_train_step(batch, result.steps[0], version_before,
                                                               self.config.grpo.mismatch_warning_threshold))
        self.run_state.last_train = result
        return self._record_step(batch, result.metrics, result.seconds, version_before)

    def _record_step(self, batch: Trajectories, train_metrics: dict[str, float], seconds: float,
                     version_before: int) -> StepMetrics:
        with self.timed("metrics"):
            metrics = step_metrics(self.step_count + 1, self.policy.version, batch, train_metrics,
                                   {"train": seconds}, version_before)
            # the async producer's rollout/ figures, dynamic sampling's rounds (tries, kept and dropped groups)
            metrics.values.update({k: v for k, v in batch.info.items() if k.startswith(("rollout/", "dynamic_sampling/"))})
            self.run_state.end_step(metrics)
        return metrics

    def _skips_logprobs_pass(self, batch: Trajectories) -> bool:
        """Whether ``step()`` can skip the logprobs pass and take the batch's logprobs from its train step
        (TRL's rule for on-policy steps): one update on the batch, so the step's own forward, at the weights
        the pass would use, computes exactly its values (bitwise here: tests/session/test_step_logprobs.py);
        rlkit's loss (a loss function of yours may read ``prev_logprobs`` itself); no reference pass needed; and
        a policy that returns them (not a Ray worker group, not Megatron with pipeline parallelism)."""
        return (isinstance(self.loss_fn, RLLoss) and not self.needs_reference
                and self.policy.returns_step_logprobs
                and stages.one_update(batch.batch_size, self.config.grpo.num_epochs,
                                      self.config.policy.train_global_batch_size))

    def run(self, steps: Optional[int] = None, progress: bool = True,
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
        self._refuse_if_closed("run")
        from tqdm.auto import tqdm

        from rlkit.stages.skipped_steps import SKIPPED, refused_update, skipped_in_a_row, too_many_skipped

        total = self.config.grpo.max_num_steps if steps is None else steps
        self.run_state.stop_requested = False
        done = []
        bar = tqdm(total=total, desc="GRPO", disable=not progress, leave=True)
        clock = self._clock = StepClock()
        try:
            for _ in range(total):
                version_before, t0 = self.policy.version, time.perf_counter()
                try:
                    metrics = self.step()
                except Exception as error:
                    refused = refused_update(error)
                    if refused is None:
                        raise
                    metrics = self._skip_step(refused, version_before, t0)
                done.append(metrics)
                with clock.part("progress"):
                    self._show_progress(bar, metrics)
                period = self.config.grpo.val_period
                if period and self.step_count % period == 0:
                    with clock.part("eval"):
                        metrics.values["validation/accuracy"] = self.evaluate().accuracy
                clock.finish(metrics.values)
                # the listeners log this record, so their seconds go to the next one (timing/listeners, logging,
                # checkpoint...); the last step's are added to its record in history when the loop ends
                clock = self._clock = StepClock()
                with clock.part("listeners"):
                    for listener in ([on_step] if on_step else []) + self.listeners:
                        listener(metrics)
                limit = self.config.grpo.max_consecutive_skipped_steps
                if SKIPPED in metrics.values and skipped_in_a_row(self.history) >= limit:
                    raise too_many_skipped(limit, self.history, refused) from refused
                if self.stop_requested:
                    break
        except KeyboardInterrupt:
            raise RunInterrupted(f"run() stopped after step {self.step_count} ({len(done)} of {total} finished in "
                                 "this call); the session is consistent, the finished steps are in "
                                 "session.history, and run() or step() carries on from here") from None
        finally:
            self._clock = None
            with clock.part("progress"):  # closing joins tqdm's monitor thread: milliseconds under load
                bar.close()
        if done:
            clock.add_to(done[-1].values)
        return done

    def _show_progress(self, bar: Any, metrics: StepMetrics) -> None:
        shown = {"reward": f"{metrics['rollout/reward_mean']:.3f}",
                 "entropy": f"{metrics.get('train/approx_entropy', float('nan')):.3f}"}
        if self.needs_reference:
            shown["kl"] = f"{metrics.get('train/kl', 0.0):.4f}"
        bar.set_postfix(shown, refresh=False)
        bar.update(1)

    def _skip_step(self, error: BaseException, version_before: int, t0: float) -> StepMetrics:
        """Record the step whose update the policy refused as a skipped step: its prompts are consumed, its
        metrics are its batch's rollout metrics and ``train/skipped_steps``; the generator is told the step is
        over (refit only if an earlier optimizer step of this RL step was applied)."""
        from rlkit.stages.skipped_steps import skipped_step_metrics

        metrics = skipped_step_metrics(self.step_count + 1, self.policy.version, self._latest(None, "train"),
                                       version_before, time.perf_counter() - t0, self.history)
        self.run_state.end_step(metrics)
        if self.stale:
            self.refit()
        else:  # same weights: a refit would copy what the generator holds; async GRPO needs the step count
            self.rollouts.weights_loaded(self.generator_version, self.step_count)
        warnings.warn(f"step {metrics.step} skipped ({error}); {metrics['train/skipped_steps']:.0f} skipped so far, "
                      f"stopping after {self.config.grpo.max_consecutive_skipped_steps} in a row "
                      "(grpo.max_consecutive_skipped_steps)", stacklevel=3)
        return metrics

    def request_stop(self) -> None:
        """Ask ``run()`` to end after the step it is in (what the dashboard's stop button calls); no step is cut
        in half. The next ``run()`` starts without the request."""
        self.run_state.stop_requested = True
