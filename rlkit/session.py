"""The Session: a policy, a reference, a generator, an environment and prompt data, alive in one process.

Components and a run: the components are one :class:`rlkit.builders.Components` record, the run's mutable state
one :class:`rlkit.run.state.RunState`, whose batches come from a rollout source (:mod:`rlkit.run.sources`); the
step and run loops are :mod:`rlkit.run.loop`. Each stage method calls the stage function of the same name with
the config's settings for it (``session.settings``) and keeps the result, so a notebook can re-run any cell;
nothing here computes a loss or an advantage. It also keeps which policy version the generator holds
(``stale``) and which prompts the current step uses: re-running ``rollout()`` within a step returns the same
prompts and samples, and the step's prompts are consumed when ``train()`` completes.
"""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path
from typing import Any, Callable, Mapping, Optional, Sequence

from rlkit import stages
from rlkit.builders import (build_components, check_sft_columns, companions_note, environment_record, loss_companions,
                            needs_reference, rebuild, saved_environment, start_endpoint)
from rlkit.config.changes import Change, changes_summary
from rlkit.config.loading import load_config
from rlkit.config.memory_plan import plan_memory, refuse_unless_fits
from rlkit.config.run import RunConfig
from rlkit.data import PromptSampler
from rlkit.errors import SessionClosedError, StageOrderError
from rlkit.generation.base import SamplingSettings
from rlkit.notebook.dashboard import Dashboard
from rlkit.notebook.display import session_html, session_summary
from rlkit.run import loop
from rlkit.run.fork import compare_branches, fork, forks_of
from rlkit.run.history import weights_at
from rlkit.run.replay import named_losses, replay
from rlkit.run.sources import RolloutSource, rollout_source, step_seed, warn_if_off_policy
from rlkit.run.state import RunState
from rlkit.stages.compare import compare_losses
from rlkit.stages.metrics import StepMetrics
from rlkit.stages.step_clock import StepClock
from rlkit.startup import StartupReport
from rlkit.tracking.checkpoint import export_hf, load_session, read_checkpoint_state, save_session
from rlkit.tracking.records import RunRecorder
from rlkit.trajectories import Trajectories


def _view(record: str, name: str, doc: str, settable: bool = False) -> property:
    """``session.<name>``, read from (and, if ``settable``, assigned to) ``session.<record>.<name>``, the one
    place the value is kept."""
    return property(lambda session: getattr(getattr(session, record), name),
                    (lambda session, value: setattr(getattr(session, record), name, value)) if settable else None,
                    doc=f"{doc} (session.{record}.{name})")


class Session:
    """Holds the components of an RL run and exposes one method per stage."""

    def __init__(self, config: RunConfig, env: Any = None, loss_fn: Optional[Callable] = None, verbose: bool = False,
                 log_dir: Optional[str | Path] = None, wandb: Optional[bool] = None):
        """Build the engines of ``config``, printing one line per engine with its time. ``verbose=True`` also
        shows the third-party notices a quiet start holds back (:mod:`rlkit.quiet`); ``session.startup`` is
        what the start cost (seconds per part) and the warnings it showed. ``log_dir`` or ``wandb`` records the
        session from the start, as :meth:`log_to` does."""
        self.config = config
        refuse_unless_fits(config)  # a config that cannot fit is refused before anything loads, with the plan
        self.startup = StartupReport(verbose=verbose)
        self.components = build_components(config, self.startup, env, loss_fn)
        self.generator_version = self.policy.version
        # chosen once: a multi-turn environment plays whole conversations, scored as they are played
        self._sample_rows = ((lambda *a: stages.conversations(self.generator, self.tokenizer, self.env, *a))
                             if stages.is_multi_turn(self.env) else
                             (lambda *a: stages.rollout(self.generator, self.tokenizer, *a)))
        self.rollouts: Optional[RolloutSource] = None
        self._start_run(RunState.fresh(config, self.dataset))
        self.listeners: list[Callable[[StepMetrics], None]] = []  # called after every step of run()
        if log_dir is not None or wandb is not None:
            self.log_to(log_dir, wandb)

    tokenizer, dataset, env, policy, generator, weight_sync = (
        _view("components", name, f"the session's {name.replace('_', ' ')}", settable=True)
        for name in ("tokenizer", "dataset", "env", "policy", "generator", "weight_sync"))
    loss_fn = _view("components", "loss_fn", "the loss train() minimizes (assign one of yours to replace it)", True)

    @property
    def needs_reference(self) -> bool:
        """Whether ``logprobs()`` also runs the reference policy: the loss says so (RLLoss: a KL penalty, or KL
        folded into the reward); a loss function of yours that does not say gets them."""
        return needs_reference(self.loss_fn)

    @property
    def settings(self) -> stages.StageSettings:
        """What each stage reads from the config (:mod:`rlkit.stages.settings`), built once per config."""
        if getattr(self, "_settings", (None,))[0] is not self.config:
            self._settings = (self.config, stages.StageSettings.from_config(self.config))
        return self._settings[1]

    @classmethod
    def from_config(cls, source: str | Path | Mapping = "quickstart", overrides: Sequence[str] | Mapping = (),
                    **kwargs: Any) -> "Session":
        """A session from a shipped preset name, a YAML path or a mapping, with dotted overrides
        (``["grpo.num_generations_per_prompt=8"]`` or ``{"grpo.num_generations_per_prompt": 8}``); ``kwargs``
        go to the constructor (``env=``, ``loss_fn=``, ``verbose=True``). The config's warnings join the
        start-up's in the session card."""
        loading = StartupReport()
        with loading.part("config", quiet=False):
            config = load_config(source, overrides)
        session = cls(config, **kwargs)
        loading.joined(session.startup)
        session.startup = loading
        return session

    def configure(self, overrides: Sequence[str] | Mapping[str, Any] | RunConfig) -> None:
        """Change settings in place without restarting the engines, e.g.
        ``session.configure(["loss_fn.policy_loss=gspo"])``; prints what changed (``key: old -> new``) and what
        each change needed: :data:`rlkit.config.changes.CHANGES`, rebuilt by :data:`rlkit.builders.REBUILDS` (a loss
        function you supplied is kept, with a warning). The new config is ``session.config``; nothing is returned,
        so a cell ending in this call shows only the changes. Keys that need
        ``reset()`` (``seed``) or a new Session (engines, data, environment, ``grpo.async_grpo``) raise
        ConfigError naming every one, and nothing is changed."""
        self._refuse_if_closed("configure")
        old, old_loss = self.config, self.loss_fn
        changes = rebuild(self, overrides, "configure()", refused={Change.RUN, Change.SESSION})
        new_loss = stages.loss_description(self.loss_fn) if self.loss_fn is not old_loss else None
        print(changes_summary(old, self.config, changes, new_loss))
        note = companions_note(old, overrides) if "loss_fn.policy_loss" in changes else None
        if note:
            print(note)
        if any(key.startswith("logger.") or key == "name" for key in changes):
            self._follow_logger_change(old)

    def reset(self, config: Sequence[str] | Mapping[str, Any] | RunConfig = ()) -> "Session":
        """Put the session in the state ``Session(config)`` would start in, keeping its engines (a sweep does
        this between runs: starting vLLM and Megatron costs far more than a short run).

        ``config``: a RunConfig or overrides of the current one (default: none, this run over); any key short of
        a new Session in :data:`rlkit.config.changes.CHANGES`, else ConfigError. Weights come back from the model
        folder (the policy, then the generator by a refit) and become the reference; the optimizer, schedule,
        run state (step 0, the sampler at the start of the seed's order, a new baseline) and rollout source are
        new; the loss is rebuilt as in ``configure``; the RNGs are seeded as at construction. Listeners stay."""
        self._refuse_if_closed("reset")
        rebuild(self, config, "reset()", refused={Change.SESSION}, always=Change.RUN)
        return self

    def _start_run(self, run: RunState) -> None:
        """Make ``run`` the run state, with a new rollout source over it: the one path by which the
        constructor, ``reset()``, ``restore_run_state()`` and a ``configure()`` of the rollouts replace them."""
        if self.rollouts is not None:
            self.rollouts.close()  # async GRPO: stop the producer, drop the batches sampled for the old state
        self.run_state = run
        self.rollouts = rollout_source(self.config, self._sample, self._score, run, self.generator_version,
                                       lambda: self.config.updates_per_step)

    def restore_run_state(self, state: Mapping[str, Any]) -> None:
        """Continue the run ``RunState.state_dict()`` saved (a checkpoint does this): the run state is replaced,
        the rollout source restarted at the restored step, and the generator refit."""
        self._refuse_if_closed("restore_run_state")
        run = RunState.fresh(self.config, self.dataset)
        run.load_state_dict(state)
        self._start_run(run)
        self.refit()

    # ---- state -----------------------------------------------------------------------------------
    step_count = _view("run_state", "step", "RL steps completed")
    history = _view("run_state", "history", "StepMetrics of every completed step")
    batch = _view("run_state", "batch", "the latest batch a stage returned")
    sampler = _view("run_state", "sampler", "the prompt sampler (its position is the run's position in the data)")
    baseline = _view("run_state", "baseline", "reinforce_baseline's running reward mean")
    last_train, last_refit, last_eval, last_sft = (_view("run_state", f"last_{stage}", f"the latest {stage}() result")
                                                   for stage in ("train", "refit", "eval", "sft"))
    stop_requested = _view("run_state", "stop_requested", "run() ends after the current step")

    @property
    def stale(self) -> bool:
        """True when the generator holds older weights than the policy (call ``refit()``)."""
        self._refuse_if_closed("stale")
        return self.generator_version != self.policy.version

    def _latest(self, batch: Optional[Trajectories], stage: str) -> Trajectories:
        if batch is None and self.batch is None:
            raise StageOrderError(f"no rollout yet: call session.rollout() before session.{stage}()")
        return batch if batch is not None else self.batch

    def _keep(self, batch: Trajectories) -> Trajectories:
        self.run_state.batch = batch
        return batch

    def sampling(self, seed: Optional[int] = None) -> SamplingSettings:
        """The sampling settings a rollout uses now (``policy.generation.*``), seeded per step from ``seed``
        and the step count unless ``seed`` is given, so a rollout re-run within a step samples the same."""
        self._refuse_if_closed("sampling")
        g = self.config.policy.generation
        return SamplingSettings(g.temperature, g.top_p, g.top_k, g.max_new_tokens, g.stop_strings,
                                seed=step_seed(self.config.seed, self.step_count) if seed is None else seed)

    # ---- what the rollout source calls -----------------------------------------------------------
    def _sample(self, rows: Sequence[dict], seed: int, generator_version: int) -> Trajectories:
        """G samples for each of ``rows`` (not scored), or with a multi-turn environment G conversations each,
        scored as they are played (:mod:`rlkit.stages.conversations`); async GRPO's producer thread calls it too."""
        with self.timed("rollout"):  # each of dynamic sampling's rounds
            return self._sample_rows(rows, self.sampling(seed), generator_version, self.settings.rollout)

    def _score(self, batch: Trajectories) -> Trajectories:
        if batch.rewards is not None:  # multi-turn conversations are scored as they are played
            return batch
        with self.timed("score"):  # dynamic sampling scores each round inside the rollout
            return stages.score(batch, self.env, self.settings.score)

    # ---- stages ----------------------------------------------------------------------------------
    def rollout(self, rows: Optional[Sequence[dict]] = None, seed: Optional[int] = None) -> Trajectories:
        """This step's batch from the rollout source the config chose (plain: not scored; dynamic sampling:
        scored; async GRPO: the producer's next ready batch, ``seed`` unused), see
        :mod:`rlkit.run.sources`. Within a step it is the same batch again. ``rows``: G samples of
        exactly these prompts instead, whatever the source: not scored, or with a multi-turn environment G
        conversations each, scored as they are played. The batch is marked with the step it is for
        (``rollout_step``), so that ``train()`` can tell a batch of an earlier step."""
        self._refuse_if_closed("rollout")
        loop.refit_if_released(self)
        if rows is None:
            batch = self.rollouts.batch(self.run_state, self.sampling(seed).seed, self.generator_version,
                                        self.policy.version)
        else:
            warn_if_off_policy(self.generator_version, self.policy.version)
            with self.rollouts.exclusive():  # async GRPO's producer may be sampling
                batch = self._sample(rows, self.sampling(seed).seed, self.generator_version)
        return self._keep(batch.with_(rollout_step=self.step_count))

    def score(self, batch: Optional[Trajectories] = None) -> Trajectories:
        """Rewards from the environment for a batch that has none yet. A batch that has them (dynamic sampling
        scores its candidates to choose among them) is kept as it is: scoring again would cost an environment
        pass and, with a random reward, undo the choice; ``stages.score(batch, session.env)`` rescores."""
        self._refuse_if_closed("score")
        return self._keep(self._score(self._latest(batch, "score")))  # _score keeps a scored batch as it is

    def advantages(self, batch: Optional[Trajectories] = None) -> Trajectories:
        """Per-token advantages ``[B, T]`` from the rewards by ``grpo.advantage_estimator`` (group mean and
        std for GRPO; reinforce_baseline's running mean is the session's ``baseline``)."""
        self._refuse_if_closed("advantages")
        g = self.config.grpo
        return self._keep(stages.advantages(self._latest(batch, "advantages"), g.advantage_estimator,
                                            g.advantage_params(), self.baseline))

    def logprobs(self, batch: Optional[Trajectories] = None) -> Trajectories:
        """The trainer's logprobs of the sampled tokens (``prev_logprobs`` ``[B, T]``), the reference policy's
        when the loss needs them (KL), the entropy, and the generator/trainer mismatch (warns past
        ``grpo.mismatch_warning_threshold``)."""
        self._refuse_if_closed("logprobs")
        loop.release_engine_weights(self)
        return self._keep(stages.logprobs(self._latest(batch, "logprobs"), self.policy, self.needs_reference,
                                          self.config.grpo.mismatch_warning_threshold))

    def loss(self, batch: Optional[Trajectories] = None) -> stages.LossReport:
        """The loss and metrics on the batch under the current weights; no step is taken."""
        self._refuse_if_closed("loss")
        return stages.loss(self._latest(batch, "loss"), self.policy, self.loss_fn)

    def train(self, batch: Optional[Trajectories] = None, allow_reuse: bool = False) -> StepMetrics:
        """Loss and optimizer step(s) on the batch; completes the RL step and records its metrics.

        Interrupted (Ctrl-C, Jupyter's stop) after an update took effect, the step is still recorded (step
        count, history with ``train/interrupted`` = 1, next step's prompts) before the interrupt propagates;
        interrupted before any update, nothing is recorded and the same call can simply be repeated.
        A batch of an earlier step (one trained on already, too) warns unless ``allow_reuse``
        (:mod:`rlkit.stages.reuse`)."""
        self._refuse_if_closed("train")
        metrics = loop.train(self, self._latest(batch, "train"), allow_reuse, on_policy=False)
        self._record_step(metrics)
        return metrics

    # the step and the run loop: functions of the session in rlkit.run.loop; recorded when the session records
    request_stop, timed = loop.request_stop, loop.timed

    def step(self) -> StepMetrics:
        """One whole RL step (:func:`rlkit.run.loop.step`: rollout, score, logprobs, advantages, train, refit),
        recorded by :meth:`log_to`'s loggers when the session records."""
        inside_run = self._clock is not None  # run() records its steps once its listeners run
        metrics = loop.step(self)
        if not inside_run:
            self._record_step(metrics)
        return metrics

    def run(self, steps: Optional[int] = None, progress: bool = True,
            on_step: Optional[Callable[[StepMetrics], None]] = None) -> list[StepMetrics]:
        """``steps`` RL steps (:func:`rlkit.run.loop.run`, which says what a stop, an interrupt and a skipped step
        do); each is recorded when the session records, before ``on_step`` and the listeners see it."""

        def recorded(metrics: StepMetrics) -> None:
            self._record_step(metrics)
            if on_step is not None:
                on_step(metrics)

        return loop.run(self, steps, progress, on_step=recorded)
    _clock: Optional[StepClock] = None  # the step clock of the step under way in step() or run()

    def openai_endpoint(self) -> Any:
        """An OpenAI-compatible chat endpoint over the engine, for agents (:func:`rlkit.stages.agent_rollout`) and
        chats from a cell: started on 127.0.0.1 on the first call, closed with the session
        (:mod:`rlkit.generation.openai_server`). Not while async GRPO's producer samples."""
        self._refuse_if_closed("openai_endpoint")
        return start_endpoint(self.components, self.config, self.sampling())

    def refit(self) -> Any:
        """Push the policy's weights into the generator. Interrupted midway, the generator stays stale."""
        self._refuse_if_closed("refit")
        self.generator_version = -1  # unknown mixture until the sync completes
        with self.rollouts.exclusive():
            report = stages.refit(self.policy, self.generator, self.weight_sync)
        self.generator_version = report.policy_version
        self.rollouts.weights_loaded(report.policy_version, self.step_count)
        self.run_state.last_refit = report
        return report

    def memory_plan(self):
        """The bytes this session's config needs per device and per part (:mod:`rlkit.config.memory_plan`)."""
        return plan_memory(self.config)

    def evaluate(self, num_prompts: Optional[int] = None, greedy: Optional[bool] = None) -> stages.EvalResult:
        """Held-out accuracy of the current policy (refits the generator first if it is stale)."""
        self._refuse_if_closed("evaluate")
        if self.stale:
            self.refit()
        settings = self.settings.eval if greedy is None else replace(self.settings.eval, greedy=greedy)
        n, held_out = num_prompts or settings.num_prompts, self.dataset["validation"]
        rows = list(held_out.select(range(min(n, len(held_out)))))
        with self.rollouts.exclusive():
            self.run_state.last_eval = stages.evaluate(self.generator, self.tokenizer, self.env, rows,
                                                       self.policy.version, settings, len(held_out))
        if self._clock is None and self._recording():  # inside run(), the step's metrics carry it
            self.records.log({"validation/accuracy": self.last_eval.accuracy}, step=self.step_count)
        return self.last_eval

    def sft(self, num_steps: Optional[int] = None, progress: bool = True, refit: bool = True) -> stages.SFTResult:
        """Supervised warm start on the task's answers; the result becomes the KL reference policy.

        Like ``step()``, it ends with a refit, so the next ``rollout()`` samples from the fine-tuned weights
        (SFT is a phase of its own, not one stage of an RL step). ``refit=False`` trains the policy only and
        leaves the generator stale, as ``train()`` does. Interrupted, SFT keeps the steps it took and the
        generator stays stale; ``step()`` and ``evaluate()`` refit first.
        """
        self._refuse_if_closed("sft")
        check_sft_columns(self.config, self.dataset)
        settings = self.settings.sft if num_steps is None else stages.SFTSettings.from_config(self.config, num_steps)
        sampler = PromptSampler(self.dataset["train"], settings.sft.batch_size, seed=self.config.seed + 1)
        self.run_state.last_sft = stages.sft(self.policy, self.tokenizer, sampler, settings, progress)
        if refit:
            self.refit()
        return self.last_sft

    # ---- what if: rlkit.run.history, rlkit.run.replay, rlkit.stages.compare, rlkit.run.fork ------
    store = _view("run_state", "store", "past batches (history[k].batch) and weight snapshots, bounded by history.*")

    def replay(self, step: int, loss: Any = None, estimator: Any = None, **overrides: Any) -> Any:
        """Step ``step`` recomputed on its stored batch and starting weights under another ``loss`` (a policy loss
        name brings its preset's companion settings, as in ``configure``), advantage ``estimator`` or ``loss_fn.*``
        ``overrides``: loss, per-token maps, gradient norm and its cosine to the gradient taken. The live session
        is not changed (:func:`rlkit.run.replay.replay`)."""
        return replay(self, step, loss, estimator, **{**self._companions(loss), **overrides})

    def compare_losses(self, batch: Optional[Trajectories] = None,
                       losses: Mapping[str, Any] | Sequence[str] = ("ppo_clip", "gspo", "cispo")) -> Any:
        """Several losses on one batch (default: the latest) at the current weights, per token and by gradient
        (:func:`rlkit.stages.compare.compare_losses`); ``losses``: policy loss names, or name -> name or loss."""
        return compare_losses(self._latest(batch, "compare_losses"), self.policy, named_losses(self, losses))

    def weights_at(self, step: Optional[int] = None) -> Any:
        """Which weights past steps started from exist: snapshots (replay's) and checkpoints
        (:func:`rlkit.run.history.weights_at`)."""
        return weights_at(self.store, self.config, step)

    def fork(self, n: Optional[int] = None) -> Any:
        """In-memory branches sharing the engines, each with its own weights, optimizer, run state, config and RNG
        (:mod:`rlkit.run.fork`): ``b = session.fork()``, ``a, b = session.fork(2)``; ``b.run(30)`` swaps b in."""
        return fork(self, n)

    @property
    def branches(self) -> dict[str, Any]:
        """The branches by name ("main": the session's state before the first fork); one is active."""
        return dict(forks_of(self).branches)

    def compare_branches(self, num_prompts: Optional[int] = None, greedy: Optional[bool] = None) -> Any:
        """Held-out accuracy of every branch on the same prompts, as a DataFrame (:func:`rlkit.run.fork.compare_branches`)."""
        return compare_branches(self, num_prompts, greedy)

    def _companions(self, loss: Any) -> dict[str, Any]:
        """The ``loss_fn.*`` settings (prefix removed) a switch to policy loss ``loss`` brings (builders.loss_companions)."""
        return {k.removeprefix("loss_fn."): v for k, v in loss_companions(self.config, {"loss_fn.policy_loss": loss}).items()}

    # ---- notebook and checkpoints ----------------------------------------------------------------
    def dashboard(self) -> Any:
        """A live widget (plots of reward, KL, entropy, clipping, lengths, stage times; latest samples;
        a stop button) that updates during ``run()``. Falls back to text without ipywidgets."""
        self._refuse_if_closed("dashboard")
        return Dashboard(self)

    def save(self, path: str | Path) -> Path:
        """Write a checkpoint (weights, optimizer, scheduler, RNG, data position, step, config, which environment)
        atomically."""
        self._refuse_if_closed("save")
        return save_session(self, path, {"environment": self.environment_record()})

    def environment_record(self) -> dict[str, Any]:
        """What a checkpoint keeps of the environment, so that :meth:`load` can build it again
        (:func:`rlkit.builders.environment_record`)."""
        return environment_record(self.env, self.components.config_env)

    @classmethod
    def load(cls, path: str | Path, env: Any = None, **kwargs: Any) -> "Session":
        """A session restored from ``save(path)``; the next step continues exactly where it left off.

        The environment is the one the checkpoint was made with: the config's (``env.name``, ``env.reward_fn``),
        or a reward function of yours imported again by its path; one that cannot be built again (a function
        defined in a notebook) is refused with the fix, ``Session.load(path, env=...)``. ``env`` replaces it;
        ``kwargs`` go to :func:`rlkit.tracking.checkpoint.load_session` (``config=``, ``overrides=``, ``loss_fn=``)."""
        if env is None:
            env = saved_environment(read_checkpoint_state(path), path)
        return load_session(cls, path, env=env, **kwargs)

    def export_hf(self, path: str | Path) -> Path:
        """The policy's current weights (merged) as an HF model folder that transformers and vLLM load, with the
        model folder's config and tokenizer files, written atomically (:func:`rlkit.tracking.checkpoint.export_hf`)."""
        self._refuse_if_closed("export_hf")
        return export_hf(self, path)

    # ---- records ---------------------------------------------------------------------------------
    records: Optional[Any] = None  # a RunRecorder while the session records (log_to), else None

    def log_to(self, log_dir: Optional[str | Path] = None, wandb: Optional[bool] = None,
               run_dir: Optional[str | Path] = None) -> Path:
        """Record this session from now on as ``rlkit train`` records a run: ``step()``, ``train()``, ``run()`` and
        ``evaluate()`` write ``metrics.jsonl``, a ``rollout/samples`` table every ``logger.sample_table_period``
        steps (``tables.jsonl``) and, with ``wandb=True``, a wandb run (offline unless ``logger.wandb_mode``
        says otherwise), into ``<log_dir>/<name>`` (``logger.log_dir``, ``name``) or ``run_dir``; ``config.yaml``
        beside them. Returns the run folder; ``rlkit.open_run(folder)`` reads it back.

        ``log_dir`` and ``wandb`` set ``logger.log_dir`` and ``logger.wandb_enabled``; later ``configure()`` calls
        of ``logger.*`` take effect at the next record (a changed folder or name starts a new run folder).
        Starting again over a folder replaces its records, as a fresh ``rlkit train`` does."""
        self._refuse_if_closed("log_to")
        overrides = {k: v for k, v in (("logger.log_dir", None if log_dir is None else str(log_dir)),
                                       ("logger.wandb_enabled", wandb)) if v is not None}
        if overrides:
            rebuild(self, overrides, "log_to()", refused={Change.ROLLOUTS, Change.LOSS, Change.OPTIMIZER,
                                                          Change.RUN, Change.SESSION})
        self.stop_logging()
        folder = Path(run_dir) if run_dir is not None else Path(self.config.logger.log_dir) / self.config.name
        self.records = RunRecorder(folder, self.config)
        self._records_folder_fixed = run_dir is not None
        return folder

    def stop_logging(self) -> None:
        """Finish the records (close the files, finish the wandb run); the session stops recording. Safe twice."""
        if self.records is not None:
            self.records.finish()
        self.records = None

    def _recording(self) -> bool:
        """Whether the session records; its loggers follow the current ``logger.*`` first."""
        if self.records is not None:
            self.records.follow(self.config)
        return self.records is not None

    def _record_step(self, metrics: StepMetrics) -> None:
        if self._recording():
            self.records.log_step(metrics, self.batch, self.timed)

    def _follow_logger_change(self, old: RunConfig) -> None:
        """``configure()`` of ``logger.*`` or ``name``: a session that did not record starts (into the new folder);
        one that does moves to the new folder when it changed, else its loggers follow at the next record."""
        folder = Path(self.config.logger.log_dir) / self.config.name
        moved = folder != Path(old.logger.log_dir) / old.name and not getattr(self, "_records_folder_fixed", False)
        if self.records is None or moved:
            print(f"recording into {self.log_to()}")

    # ---- lifecycle -------------------------------------------------------------------------------
    closed = False  # True from close() on: every stage and method then raises SessionClosedError

    def _refuse_if_closed(self, method: str) -> None:
        """A clear error for ``method`` on a closed session, instead of an AttributeError on None deep inside a
        stage. Called inline, not as a decorator: a wrapper's frame would shift every warning's stacklevel."""
        if self.closed:
            raise SessionClosedError(
                f"this session is closed: session.{method}() needs the engines close() released. Create a new "
                "one with Session.from_config(...), or Session.load(path) to continue from a checkpoint")

    def close(self) -> None:
        """Release the generator, the policy, their process groups and Megatron's global state; a new Session
        can follow. Safe twice."""
        self.closed = True
        self.stop_logging()
        if self.rollouts is not None:
            self.rollouts.close()
        self.rollouts = None
        self.components.close()

    def __enter__(self) -> "Session":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    __repr__, _repr_html_ = session_summary, session_html  # rlkit.notebook.display: the text and the card
