"""The step as an object: a :class:`Run` owns the moving parts of one run and calls the stage functions.

What it owns: the components (policy, generator, environment, data, loss: :class:`rlkit.run.components.Components`),
the run config, the run state (:class:`rlkit.run.state.RunState`) and the rollout source over it
(:mod:`rlkit.run.sources`), which policy version the generator holds, the memory hand-off between engine and
policy (:class:`rlkit.weight_sync.Handoff`), the step clock, the listeners, the records and the branches of a fork.

Why one object: each stage method reads its inputs here and calls the stage function of :mod:`rlkit.stages` with
the components and the stage settings; ``step()`` calls those methods, so an RL step reads top to bottom in this
file, and nothing it calls reaches back up; what the loop over steps (``run()``) adds between steps is in
:mod:`rlkit.run.steps`. :class:`rlkit.Session` is the cell-facing facade: it builds a Run and
delegates to it, and adds what needs the builders (``configure``, ``reset``, ``log_to``) or checkpoint files.

Within a step a rollout returns the same prompts and samples again; the step's prompts are consumed when
``train()`` completes (:class:`rlkit.run.state.RunState`).
"""

from __future__ import annotations

import warnings
from dataclasses import replace
from pathlib import Path
from typing import Any, Callable, ContextManager, Mapping, Optional, Sequence

from rlkit import stages
from rlkit.algorithms import RLLoss
from rlkit.config.run import RunConfig
from rlkit.errors import SessionClosedError, StageOrderError
from rlkit.generation.base import SamplingSettings
from rlkit.run import fork as forking, history, offline
from rlkit.run.components import Components
from rlkit.run.metrics import StepMetrics, step_metrics
from rlkit.run.replay import ReplayReport, named_losses, replay
from rlkit.run.reuse import warn_if_reused
from rlkit.run.sources import RolloutSource, rollout_source, step_seed, warn_if_off_policy
from rlkit.run.state import RunState
from rlkit.run.step_clock import StepClock
from rlkit.run.steps import run_steps
from rlkit.stages.compare import compare_losses
from rlkit.tracking.checkpoint import CRITIC_DIR, POLICY_DIR, read_checkpoint_state, restore_rng, save_checkpoint
from rlkit.tracking.records import RunRecorder
from rlkit.trajectories import Trajectories


def needs_reference(loss_fn: Callable) -> bool:
    """The one rule for whether reference logprobs are computed (and the reference weights kept): the loss says so
    (RLLoss: a KL penalty, or KL folded into the reward); a loss function of yours that does not say gets them."""
    return getattr(loss_fn, "needs_reference", True)


class Run:
    """One run over its components: a method per stage, ``step()``, ``run()``, refit, evaluation and the what-if
    instruments; see the module docstring."""

    def __init__(self, config: RunConfig, components: Components):
        self.config = config
        self.components = components
        self.generator_version = components.policy.version  # the policy version the generator holds (-1: none)
        # chosen once: a multi-turn environment plays whole conversations, scored as they are played
        env, generator, tokenizer = components.env, components.generator, components.tokenizer
        self._sample_rows = ((lambda *a: stages.conversations(generator, tokenizer, env, *a))
                             if stages.is_multi_turn(env) else (lambda *a: stages.rollout(generator, tokenizer, *a)))
        self.rollouts: Optional[RolloutSource] = None
        self.state: RunState = RunState.fresh(config, components.dataset)
        self.listeners: list[Callable[[StepMetrics], None]] = []  # called after every step of run()
        self.records: Optional[RunRecorder] = None  # while the run records (Session.log_to, rlkit train)
        self.clock: Optional[StepClock] = None  # the step clock of the step under way in step() or run()
        self.cell_clock = StepClock()  # the stages run cell by cell since the last record, which train() makes
        self.forks: Optional[forking.Forks] = None  # the branches, once forked
        self.closed = False
        self._settings: tuple[Any, Any] = (None, None)
        self.start(self.state)

    # ---- components and settings --------------------------------------------------------------------
    @property
    def policy(self) -> Any:
        return self.components.policy

    @property
    def generator(self) -> Any:
        return self.components.generator

    @property
    def loss_fn(self) -> Callable:
        return self.components.loss_fn

    @loss_fn.setter
    def loss_fn(self, loss_fn: Callable) -> None:
        self.components.loss_fn = loss_fn

    @property
    def needs_reference(self) -> bool:
        return needs_reference(self.loss_fn)

    @property
    def settings(self) -> stages.StageSettings:
        """What each stage reads from the config (:mod:`rlkit.stages.settings`), built once per config."""
        if self._settings[0] is not self.config:
            self._settings = (self.config, stages.StageSettings.from_config(self.config))
        return self._settings[1]

    @property
    def stale(self) -> bool:
        """True when the generator holds older weights than the policy (call ``refit()``)."""
        self.refuse_if_closed("stale")
        return self.generator_version != self.policy.version

    # what a dashboard reads (rlkit.notebook.dashboard)
    history = property(lambda self: self.state.history, doc="StepMetrics of every completed step")
    batch = property(lambda self: self.state.batch, doc="the latest batch a stage returned")
    stop_requested = property(lambda self: self.state.stop_requested, doc="run() ends after the current step")

    def sampling(self, seed: Optional[int] = None) -> SamplingSettings:
        """The sampling settings a rollout uses now (``policy.generation.*``), seeded per step from ``seed``
        and the step count unless ``seed`` is given, so a rollout re-run within a step samples the same."""
        g = self.config.policy.generation
        return SamplingSettings(g.temperature, g.top_p, g.top_k, g.max_new_tokens, g.stop_strings,
                                seed=step_seed(self.config.seed, self.state.step) if seed is None else seed)

    # ---- the run state and where batches come from ----------------------------------------------------
    def start(self, state: RunState) -> None:
        """Make ``state`` the run state, with a new rollout source over it: the one path by which the constructor,
        ``reset()``, a restored checkpoint and a change of the rollout settings replace them."""
        if self.rollouts is not None:
            self.rollouts.close()  # async GRPO: stop the producer, drop the batches sampled for the old state
        self.state = state
        self.rollouts = rollout_source(self.config, self.sample, self.score_fresh, state, self.generator_version,
                                       lambda: self.config.updates_per_step)

    def restore_run_state(self, state: Mapping[str, Any]) -> None:
        """Continue the run ``RunState.state_dict()`` saved: the run state replaced, the rollout source restarted at
        the restored step, and the generator refit."""
        self.refuse_if_closed("restore_run_state")
        run = RunState.fresh(self.config, self.components.dataset)
        run.load_state_dict(state)
        self.start(run)
        self.refit()

    def sample(self, rows: Sequence[dict], seed: int, generator_version: int) -> Trajectories:
        """G samples for each of ``rows`` (not scored), or with a multi-turn environment G conversations each,
        scored as they are played (:mod:`rlkit.stages.conversations`); async GRPO's producer thread calls it too."""
        with self.timed("rollout"):  # each of dynamic sampling's rounds
            return self._sample_rows(rows, self.sampling(seed), generator_version, self.settings.rollout)

    def score_fresh(self, batch: Trajectories) -> Trajectories:
        """Rewards for a batch that has none (multi-turn conversations are scored as they are played)."""
        if batch.rewards is not None:
            return batch
        with self.timed("score"):  # dynamic sampling scores each round inside the rollout
            return stages.score(batch, self.components.env, self.settings.score)

    def latest(self, batch: Optional[Trajectories], stage: str) -> Trajectories:
        """``batch``, or the latest batch a stage returned; a guard error naming what to run first if neither."""
        if batch is None and self.state.batch is None:
            raise StageOrderError(f"no rollout yet: call session.rollout() before session.{stage}()")
        return batch if batch is not None else self.state.batch

    def keep(self, batch: Trajectories) -> Trajectories:
        self.state.batch = batch
        return batch

    # ---- the stages ---------------------------------------------------------------------------------
    def rollout(self, rows: Optional[Sequence[dict]] = None, seed: Optional[int] = None) -> Trajectories:
        """This step's batch from the rollout source (the same batch again within a step), or with ``rows`` G
        samples of exactly those prompts; marked with the step it is for (``rollout_step``). An engine that
        released its weights for the policy is refit first, with a warning: the samples are then on-policy; so is
        one that holds no version of this policy's weights (another branch's after a fork swap, a refit cut off).
        An engine one or more updates behind samples off-policy, with a warning (the point of a cell-by-cell loop)."""
        self.refuse_if_closed("rollout")
        if self.components.handoff.engine_needs_refit():
            warnings.warn("the engine released its weights for the train step (policy.generation.vllm_cfg."
                          "release_weights_for_training): refitting before this rollout, which is then on-policy")
            self.refit()
        elif self.generator_version < 0:  # no version of these weights at all: nothing to learn from its samples
            self.refit()
        if rows is None:
            batch = self.rollouts.batch(self.state, self.sampling(seed).seed, self.generator_version,
                                        self.policy.version)
        else:
            warn_if_off_policy(self.generator_version, self.policy.version)
            with self.rollouts.exclusive():  # async GRPO's producer may be sampling
                batch = self.sample(rows, self.sampling(seed).seed, self.generator_version)
        return self.keep(batch.with_(rollout_step=self.state.step))

    def score(self, batch: Optional[Trajectories] = None) -> Trajectories:
        self.refuse_if_closed("score")
        with self.timed("score"):
            return self.keep(self.score_fresh(self.latest(batch, "score")))  # a scored batch is kept as it is

    def values(self, batch: Optional[Trajectories] = None) -> Trajectories:
        self.refuse_if_closed("values")
        with self.timed("values"):
            return self.keep(stages.values(self.latest(batch, "values"), self.components.critic,
                                           self.config.critic))

    def teacher_logprobs(self, batch: Optional[Trajectories] = None) -> Trajectories:
        self.refuse_if_closed("teacher_logprobs")
        with self.timed("teacher_logprobs"):
            self._before_policy_pass()  # (the teacher's pass needs the memory a policy pass does)
            return self.keep(stages.teacher_logprobs(self.latest(batch, "teacher_logprobs"), self.components.teacher))

    def advantages(self, batch: Optional[Trajectories] = None) -> Trajectories:
        self.refuse_if_closed("advantages")
        g, d = self.config.grpo, self.config.distillation
        with self.timed("advantages"):
            return self.keep(stages.advantages(self.latest(batch, "advantages"), g.advantage_estimator,
                                               g.advantage_params(), self.state.baseline,
                                               d.params() if d.enabled else None))

    def logprobs(self, batch: Optional[Trajectories] = None) -> Trajectories:
        self.refuse_if_closed("logprobs")
        with self.timed("logprobs"):
            self._before_policy_pass()
            return self.keep(stages.logprobs(self.latest(batch, "logprobs"), self.policy, self.needs_reference,
                                             self.config.grpo.mismatch_warning_threshold, self.timed))

    def loss(self, batch: Optional[Trajectories] = None) -> stages.LossReport:
        self.refuse_if_closed("loss")
        return stages.loss(self.latest(batch, "loss"), self.policy, self.loss_fn)

    def train(self, batch: Optional[Trajectories] = None, allow_reuse: bool = False,
              on_policy: bool = False) -> StepMetrics:
        """Loss and optimizer step(s) on the batch; completes the RL step (run state, rollout history) and returns
        its metrics. ``on_policy``: the batch has no ``prev_logprobs`` and the train step's own forward fills them
        in, with the entropy and the mismatch figures (:meth:`skips_logprobs_pass`)."""
        self.refuse_if_closed("train")
        batch = self.latest(batch, "train")
        if not allow_reuse:
            warn_if_reused(batch, self.state.step)
        version_before, seed = self.policy.version, self.sampling().seed
        self.end_warm_start()
        history.before_train(self.state.store, self.policy, self.config, self.state.step)
        self._before_policy_pass()
        try:
            result = stages.train(batch, self.policy, self.loss_fn, self.settings.train,
                                  seed=self.config.seed + self.state.step, on_policy=on_policy)
        except stages.TrainInterrupted as interrupted:
            self._end_step(batch, interrupted.metrics(), interrupted.seconds, version_before)
            raise
        except BaseException:
            self.state.store.drop_snapshot(self.state.step + 1)
            raise
        if on_policy:
            batch = self.state.batch = stages.logprobs_from_train_step(
                batch, result.steps[0], version_before, self.config.grpo.mismatch_warning_threshold)
        self.state.last_train = result
        critic_metrics = {}
        if self.components.critic is not None:  # PPO: the critic learns the returns of this batch, after the policy
            with self.timed("critic"):
                critic_metrics = stages.update_critic(batch, self.components.critic,
                                                      self.config.grpo.advantage_params(), self.config.critic)
        metrics = self._end_step(batch, result.metrics, result.seconds, version_before)
        metrics.values.update(critic_metrics)  # (under critic/, beside train/)
        history.after_train(self.state.store, self.records, self.config, batch, metrics, version_before, seed,
                            self.loss_fn, self.settings.train, self.timed)
        return metrics

    def refit(self) -> Any:
        """Push the policy's weights into the generator. Interrupted midway, the generator stays stale."""
        self.refuse_if_closed("refit")
        self.generator_version = -1  # unknown mixture until the sync completes
        with self.timed("refit"), self.rollouts.exclusive():
            self.components.handoff.before_refit()
            report = stages.refit(self.policy, self.generator, self.components.weight_sync)
        self.generator_version = report.policy_version
        self.rollouts.weights_loaded(report.policy_version, self.state.step)
        self.state.last_refit = report
        return report

    def _before_policy_pass(self) -> None:
        if self.components.handoff.before_policy_pass():
            self.generator_version = -1  # no weights until the next refit

    def evaluate(self, num_prompts: Optional[int] = None, greedy: Optional[bool] = None) -> stages.EvalResult:
        """Held-out accuracy of the current policy (refits the generator first if it is stale)."""
        self.refuse_if_closed("evaluate")
        if self.stale:
            self.refit()
        settings = self.settings.eval if greedy is None else replace(self.settings.eval, greedy=greedy)
        n, held_out = num_prompts or settings.num_prompts, self.components.dataset["validation"]
        rows = list(held_out.select(range(min(n, len(held_out)))))
        with self.rollouts.exclusive():
            self.state.last_eval = stages.evaluate(self.generator, self.components.tokenizer, self.components.env,
                                                   rows, self.policy.version, settings, len(held_out))
        if self.clock is None and self.recording():  # inside run(), the step's metrics carry it
            self.records.log({"validation/accuracy": self.state.last_eval.accuracy}, step=self.state.step)
        return self.state.last_eval

    def sft(self, num_steps: Optional[int] = None, progress: bool = True, refit: bool = True) -> stages.SFTResult:
        """Supervised warm start on the task's answers (see :meth:`rlkit.Session.sft`)."""
        self.refuse_if_closed("sft")
        result = offline.sft(self.policy, self.components, self.state, self.config, num_steps, progress)
        if refit:
            self.refit()
        return result

    def dpo(self, num_steps: Optional[int] = None, progress: bool = True, refit: bool = True,
            pairs: Optional[Sequence[Mapping[str, Any]]] = None) -> stages.DPOResult:
        """DPO on ``pairs``, ``dpo.train_file``'s or the task's answers' (see :meth:`rlkit.Session.dpo`)."""
        self.refuse_if_closed("dpo")
        result = offline.dpo(self.policy, self.components, self.state, self.config, num_steps, progress, pairs,
                             self.needs_reference)
        if refit:
            self.refit()
        return result

    def train_reward_model(self, output: str | Path, pairs: Optional[Sequence[Mapping[str, Any]]] = None,
                           eval_pairs: Optional[Sequence[Mapping[str, Any]]] = None, base: Optional[str | Path] = None,
                           progress: bool = True) -> stages.RewardModelResult:
        """A reward model on preference pairs (see :meth:`rlkit.Session.train_reward_model`)."""
        self.refuse_if_closed("train_reward_model")
        return offline.train_reward_model(self.policy, self.components, self.config, output, pairs, eval_pairs, base,
                                          progress)

    # ---- one step, and the loop over steps ----------------------------------------------------------------
    def step(self) -> StepMetrics:
        """One whole RL step: rollout, score, logprobs, (values, teacher logprobs,) advantages, train, refit;
        recorded when the run records (inside ``run()``, after its listeners). Its ``timing/`` parts add up to
        ``timing/step_total``, the rest named ``timing/other`` (:mod:`rlkit.run.step_clock`).

        Where the batch gets one update with rlkit's loss and no reference pass, the train step's own forward
        computes the batch's logprobs (the same values, bitwise here), and the separate pass is skipped:
        ``timing/logprobs`` is then 0 and the batch ends with ``prev_logprobs`` and ``entropy`` all the same."""
        self.refuse_if_closed("step")
        own_clock = self.clock is None  # run() keeps its own clock open over the progress bar and evaluation
        clock = self.clock = self.clock or StepClock()
        try:
            if self.stale:  # the weights of an update made outside step() (a cell's session.train())
                self.refit()
            with clock.part("rollout"):  # (the source's wait included; the sampling is timed in sample())
                batch = self.rollout()
            batch = self.score(batch)  # (score, logprobs, advantages and refit time themselves)
            # logprobs before advantages: estimators that fold KL into the reward need the reference logprobs
            on_policy = self.skips_logprobs_pass(batch)
            if on_policy:
                clock.skipped("logprobs")
            else:
                batch = self.logprobs(batch)
            if self.components.critic is not None:
                batch = self.values(batch)
            if self.components.teacher is not None:
                batch = self.teacher_logprobs(batch)
            batch = self.advantages(batch)
            with clock.part("train"):
                metrics = self.train(batch, on_policy=on_policy)
            self.refit()
            with clock.part("metrics"):
                metrics.values.update(self.rollouts.step_timings())
                clock.samples, clock.tokens = batch.batch_size, float(batch.completion_lengths.sum())
            if own_clock:
                clock.finish(metrics.values)
        finally:
            if own_clock:
                self.clock = None
        if own_clock:  # (inside run(), recorded once the loop's parts are on it)
            self.record_step(metrics)
        return metrics

    def skips_logprobs_pass(self, batch: Trajectories) -> bool:
        """Whether ``step()`` can take the batch's logprobs from its train step (TRL's rule for on-policy steps):
        one update on the batch, so the step's own forward, at the weights the pass would use, computes exactly
        its values (tests/session/test_step_logprobs.py); rlkit's loss (a loss function of yours may read
        ``prev_logprobs`` itself); no reference pass; and a policy that returns them (not a Ray worker group, not
        Megatron with pipeline parallelism)."""
        train = self.settings.train
        return (isinstance(self.loss_fn, RLLoss) and not self.needs_reference and self.policy.returns_step_logprobs
                and stages.one_update(batch.batch_size, train.num_epochs, train.global_batch_size))

    run = run_steps  # the loop over steps (rlkit.run.steps), a method of the Run defined there

    def request_stop(self) -> None:
        """Ask ``run()`` to end after the step it is in (the dashboard's stop button); no step is cut in half."""
        self.state.stop_requested = True

    def timed(self, part: str) -> ContextManager[None]:
        """Time a block as part ``part`` of the step under way (a stage, a checkpoint save), else of the cell-by-cell
        step the next ``train()`` records; async GRPO's producer thread is not timed (:mod:`rlkit.run.step_clock`)."""
        return (self.clock or self.cell_clock).part(part)  # (self.clock read once: run() replaces it per step)

    def _end_step(self, batch: Trajectories, train_metrics: dict[str, float], seconds: float,
                  version_before: int) -> StepMetrics:
        with self.timed("metrics"):
            # cell by cell, the stages' parts since the last record (step() writes its clock's when it is done)
            timings = {} if self.clock else {**self.cell_clock.seconds, "train": seconds}
            self.cell_clock = StepClock()
            metrics = step_metrics(self.state.step + 1, self.policy.version, batch, train_metrics, timings,
                                   version_before)
            # the async producer's rollout/ figures, dynamic sampling's rounds (tries, kept and dropped groups)
            metrics.values.update({k: v for k, v in batch.info.items()
                                   if k.startswith(("rollout/", "dynamic_sampling/", "distillation/"))})
            self.state.end_step(metrics)
        return metrics

    # ---- records ------------------------------------------------------------------------------------------
    def recording(self) -> bool:
        """Whether the run records; its loggers follow the current ``logger.*`` first."""
        if self.records is not None:
            self.records.follow(self.config)
        return self.records is not None

    def record_step(self, metrics: StepMetrics) -> None:
        if self.recording():
            self.records.log_step(metrics, self.state.batch, self.timed)

    # ---- what if: rlkit.run.history, rlkit.run.replay, rlkit.stages.compare, rlkit.run.fork --------------
    def replay(self, step: int, loss: Any = None, estimator: Any = None, **overrides: Any) -> ReplayReport:
        """Step ``step`` recomputed on its stored batch and starting weights (:func:`rlkit.run.replay.replay`)."""
        self.refuse_if_closed("replay")
        with self.rollouts.exclusive():
            return replay(self.policy, self.state.store, step, loss, estimator, **overrides)

    def compare_losses(self, batch: Optional[Trajectories], losses: Any, companions: Callable[[Any], dict]) -> Any:
        """Several losses on one batch at the current weights (:func:`rlkit.stages.compare.compare_losses`)."""
        return compare_losses(self.latest(batch, "compare_losses"), self.policy,
                              named_losses(self.loss_fn, losses, companions))

    def fork(self, n: Optional[int], facade: Any) -> Any:
        """``n`` new branches (:func:`rlkit.run.fork.fork`); each forwards what it is asked to ``facade``."""
        self.refuse_if_closed("fork")
        return forking.fork(self, n, facade)

    def branches(self, facade: Any) -> dict[str, Any]:
        return dict(forking.forks_of(self, facade).branches)

    def compare_branches(self, facade: Any, num_prompts: Optional[int] = None, greedy: Optional[bool] = None) -> Any:
        return forking.compare_branches(self, facade, num_prompts, greedy)

    def end_warm_start(self) -> None:
        """The RL optimizer and schedule back in the policy if an SFT or DPO run's are there
        (:mod:`rlkit.run.offline`)."""
        offline.hand_back(self.policy, self.state, self.settings.sft)

    def new_optimizer(self) -> None:
        """A fresh RL optimizer and schedule from ``policy.optimizer``/``policy.scheduler`` (a warm start's ends)."""
        self.policy.reset_optimizer(self.config.policy.optimizer, self.config.policy.scheduler)
        offline.forget_optimizers(self.state)

    # ---- checkpoints -----------------------------------------------------------------------------------
    def save(self, path: str | Path, extra: Optional[Mapping[str, Any]] = None) -> Path:
        """A checkpoint of this run at ``path`` (:func:`rlkit.tracking.checkpoint.save_checkpoint`)."""
        self.refuse_if_closed("save")
        self.end_warm_start()  # a checkpoint holds the RL optimizer
        with self.rollouts.exclusive():  # async GRPO: keep its producer off the sampler meanwhile
            return save_checkpoint(path, self.policy, self.state, self.config, extra, self.components.critic)

    def restore(self, path: str | Path) -> dict[str, Any]:
        """Put the checkpoint at ``path`` into this run, built from a matching config: the policy's state (weights,
        reference, optimizer, schedule, version), then the run state (the rollout source restarted, the generator
        refit), then the RNG states (last, so that nothing after them draws). Returns its ``state.json``."""
        state = read_checkpoint_state(path)
        self.policy.load_state(Path(state["folder"]) / POLICY_DIR)  # refuses another layout before loading anything
        if self.components.critic is not None:
            critic_dir = Path(state["folder"]) / CRITIC_DIR
            if critic_dir.is_dir():
                self.components.critic.load_state(critic_dir)
            else:
                warnings.warn(f"{state['folder']} holds no critic (saved before checkpoints kept it, or without PPO): "
                              "the critic starts fresh", stacklevel=3)
        self.restore_run_state(state["run_state"])
        restore_rng(state)
        return state

    # ---- lifecycle ------------------------------------------------------------------------------------
    def refuse_if_closed(self, method: str) -> None:
        """A clear error for ``method`` on a closed run, instead of an AttributeError on None deep inside a stage.
        Called inline, not as a decorator: a wrapper's frame would shift every warning's stacklevel."""
        if self.closed:
            raise SessionClosedError(
                f"this session is closed: session.{method}() needs the engines close() released. Create a new "
                "one with Session.from_config(...), or Session.load(path) to continue from a checkpoint")

    def close(self) -> None:
        """Stop recording, stop the rollout source and release the components. Safe twice."""
        self.closed = True
        if self.records is not None:
            self.records.finish()
        self.records = None
        if self.rollouts is not None:
            self.rollouts.close()
        self.rollouts = None
        self.components.close()
