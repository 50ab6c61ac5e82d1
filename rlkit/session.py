"""The Session: a policy, a reference, a generator, an environment and prompt data, alive in one process.

The cell-facing facade over one :class:`rlkit.run.run.Run` (``session.current``), which owns the moving parts
(components, run state, rollout source, generator version, memory hand-off, step clock, listeners, records,
branches) and calls the stage functions. Each stage method here delegates to the Run's method of the same name,
so a notebook can re-run any cell; nothing here computes a loss or an advantage. What the Session adds is what
needs the builders (building the components, ``configure``, ``reset``, ``log_to``) or a checkpoint of the whole
session (``save``, ``load``, the environment it was made with).
"""

from __future__ import annotations

import warnings
from pathlib import Path
from typing import Any, Callable, Mapping, Optional, Sequence

from rlkit import stages
from rlkit.builders import (build_components, check_sft_columns, companions_note, environment_record, loss_companions,
                            rebuild, saved_environment, start_endpoint)
from rlkit.config.changes import Change, changes_summary
from rlkit.config.loading import load_config
from rlkit.config.run import RunConfig
from rlkit.generation.base import SamplingSettings
from rlkit.memory.plan import plan_memory, refuse_unless_fits
from rlkit.notebook.dashboard import Dashboard
from rlkit.notebook.display import session_html, session_summary
from rlkit.run.history import weights_at
from rlkit.run.metrics import StepMetrics
from rlkit.run.run import Run
from rlkit.startup import StartupReport
from rlkit.tracking.checkpoint import checkpoint_config, export_hf, read_checkpoint_state
from rlkit.tracking.records import RunRecorder
from rlkit.trajectories import Trajectories


def _view(path: str, doc: str, settable: bool = False) -> property:
    """``session.<name>``, read from (and, if ``settable``, assigned to) ``session.<path>``, the one place the value
    is kept (``path``: dotted attributes, e.g. ``current.state.step``)."""
    *parents, name = path.split(".")

    def owner(session: "Session") -> Any:
        for part in parents:
            session = getattr(session, part)
        return session

    return property(lambda session: getattr(owner(session), name),
                    (lambda session, value: setattr(owner(session), name, value)) if settable else None,
                    doc=f"{doc} (session.{path})")


class Session:
    """Holds the components of an RL run and exposes one method per stage."""

    def __init__(self, config: RunConfig, env: Any = None, loss_fn: Optional[Callable] = None, verbose: bool = False,
                 log_dir: Optional[str | Path] = None, wandb: Optional[bool] = None):
        """Build the engines of ``config``, printing one line per engine with its time. ``verbose=True`` also
        shows the third-party notices a quiet start holds back (:mod:`rlkit.quiet`); ``session.startup`` is
        what the start cost (seconds per part) and the warnings it showed. ``log_dir`` or ``wandb`` records the
        session from the start, as :meth:`log_to` does."""
        refuse_unless_fits(config)  # a config that cannot fit is refused before anything loads, with the plan
        self.startup = StartupReport(verbose=verbose)
        self.current = Run(config, build_components(config, self.startup, env, loss_fn))
        self._records_folder_fixed = False  # log_to(run_dir=...): the records stay in that folder
        if log_dir is not None or wandb is not None:
            self.log_to(log_dir, wandb)

    config = _view("current.config", "the run config", settable=True)
    components = _view("current.components", "the engines, environment, data and loss")
    tokenizer, dataset, env, policy, generator, weight_sync = (
        _view(f"current.components.{name}", f"the session's {name.replace('_', ' ')}", settable=True)
        for name in ("tokenizer", "dataset", "env", "policy", "generator", "weight_sync"))
    loss_fn = _view("current.loss_fn", "the loss train() minimizes (assign one of yours to replace it)", True)
    needs_reference = _view("current.needs_reference", "whether logprobs() also runs the reference policy: the loss "
                            "says so (a KL penalty, or KL folded into the reward)")
    settings = _view("current.settings", "what each stage reads from the config (rlkit.stages.settings)")
    generator_version = _view("current.generator_version", "the policy version the generator holds", settable=True)
    rollouts = _view("current.rollouts", "where each step's batch comes from (rlkit.run.sources)")
    listeners = _view("current.listeners", "called with each step's StepMetrics during run()")
    records = _view("current.records", "a RunRecorder while the session records (log_to), else None", settable=True)
    stale = _view("current.stale", "True when the generator holds older weights than the policy (call refit())")
    closed = _view("current.closed", "True from close() on: every stage and method then raises SessionClosedError")
    run_state = _view("current.state", "the run's mutable state (rlkit.run.state.RunState)")
    step_count = _view("current.state.step", "RL steps completed")
    history = _view("current.state.history", "StepMetrics of every completed step")
    batch = _view("current.state.batch", "the latest batch a stage returned")
    sampler = _view("current.state.sampler", "the prompt sampler (its position is the run's position in the data)")
    baseline = _view("current.state.baseline", "reinforce_baseline's running reward mean")
    last_train, last_refit, last_eval, last_sft, last_dpo = (
        _view(f"current.state.last_{stage}", f"the latest {stage}() result")
        for stage in ("train", "refit", "eval", "sft", "dpo"))
    stop_requested = _view("current.state.stop_requested", "run() ends after the current step")
    store = _view("current.state.store", "past batches (history[k].batch) and weight snapshots, bounded by history.*")

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
        self.current.refuse_if_closed("configure")
        old, old_loss = self.config, self.loss_fn
        changes = rebuild(self.current, overrides, "configure()", refused={Change.RUN, Change.SESSION})
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
        self.current.refuse_if_closed("reset")
        rebuild(self.current, config, "reset()", refused={Change.SESSION}, always=Change.RUN)
        return self

    def restore_run_state(self, state: Mapping[str, Any]) -> None:
        """Continue the run ``RunState.state_dict()`` saved: the run state is replaced, the rollout source
        restarted at the restored step, and the generator refit."""
        self.current.restore_run_state(state)

    def sampling(self, seed: Optional[int] = None) -> SamplingSettings:
        """The sampling settings a rollout uses now (``policy.generation.*``), seeded per step from ``seed``
        and the step count unless ``seed`` is given, so a rollout re-run within a step samples the same."""
        self.current.refuse_if_closed("sampling")
        return self.current.sampling(seed)

    # ---- stages: each the Run's (rlkit.run.run) -------------------------------------------------------
    def rollout(self, rows: Optional[Sequence[dict]] = None, seed: Optional[int] = None) -> Trajectories:
        """This step's batch from the rollout source the config chose (plain: not scored; dynamic sampling:
        scored; async GRPO: the producer's next ready batch, ``seed`` unused), see
        :mod:`rlkit.run.sources`. Within a step it is the same batch again. ``rows``: G samples of
        exactly these prompts instead, whatever the source: not scored, or with a multi-turn environment G
        conversations each, scored as they are played. The batch is marked with the step it is for
        (``rollout_step``), so that ``train()`` can tell a batch of an earlier step."""
        return self.current.rollout(rows, seed)

    def score(self, batch: Optional[Trajectories] = None) -> Trajectories:
        """Rewards from the environment for a batch that has none yet. A batch that has them (dynamic sampling
        scores its candidates to choose among them) is kept as it is: scoring again would cost an environment
        pass and, with a random reward, undo the choice; ``stages.score(batch, session.env)`` rescores."""
        return self.current.score(batch)

    def values(self, batch: Optional[Trajectories] = None) -> Trajectories:
        """PPO: the critic's value [B, T] of the state before each completion token (``batch.values``), which the
        ``gae`` estimator reads; run it before ``advantages()``. ``train()`` then updates the critic too
        (``critic.*``; :mod:`rlkit.stages.values`)."""
        return self.current.values(batch)

    def teacher_logprobs(self, batch: Optional[Trajectories] = None) -> Trajectories:
        """On-policy distillation: the frozen teacher's logprobs [B, T] of the tokens the student sampled
        (``batch.teacher_logprobs``; ``distillation.*``, :mod:`rlkit.stages.teacher`); run it before ``advantages()``,
        which then turns the per-token reverse KL into advantages. ``batch.show(color="teacher")`` colours each
        token by how far the teacher disagrees."""
        return self.current.teacher_logprobs(batch)

    def advantages(self, batch: Optional[Trajectories] = None) -> Trajectories:
        """Per-token advantages ``[B, T]`` from the rewards by ``grpo.advantage_estimator`` (group mean and
        std for GRPO; reinforce_baseline's running mean is the session's ``baseline``); with distillation, the
        teacher's per-token advantages plus ``distillation.reward_weight`` times those."""
        return self.current.advantages(batch)

    def logprobs(self, batch: Optional[Trajectories] = None) -> Trajectories:
        """The trainer's logprobs of the sampled tokens (``prev_logprobs`` ``[B, T]``), the reference policy's
        when the loss needs them (KL), the entropy, and the generator/trainer mismatch (warns past
        ``grpo.mismatch_warning_threshold``)."""
        return self.current.logprobs(batch)

    def loss(self, batch: Optional[Trajectories] = None) -> stages.LossReport:
        """The loss and metrics on the batch under the current weights; no step is taken."""
        return self.current.loss(batch)

    def train(self, batch: Optional[Trajectories] = None, allow_reuse: bool = False) -> StepMetrics:
        """Loss and optimizer step(s) on the batch; completes the RL step and records its metrics.

        Interrupted (Ctrl-C, Jupyter's stop) after an update took effect, the step is still recorded (step
        count, history with ``train/interrupted`` = 1, next step's prompts) before the interrupt propagates;
        interrupted before any update, nothing is recorded and the same call can simply be repeated.
        A batch of an earlier step (one trained on already, too) warns unless ``allow_reuse``
        (:mod:`rlkit.run.reuse`)."""
        metrics = self.current.train(batch, allow_reuse)
        self.current.record_step(metrics)
        return metrics

    def step(self) -> StepMetrics:
        """One whole RL step (:meth:`rlkit.run.run.Run.step`: rollout, score, logprobs, advantages, train, refit),
        recorded by :meth:`log_to`'s loggers when the session records."""
        return self.current.step()

    def run(self, steps: Optional[int] = None, progress: bool = True,
            on_step: Optional[Callable[[StepMetrics], None]] = None) -> list[StepMetrics]:
        """``steps`` RL steps (default ``grpo.max_num_steps``) with a progress bar; ``request_stop()``
        (or the dashboard's stop button) ends the loop after the current step. Each step is recorded when the
        session records, before ``on_step`` and the listeners see it.

        A step whose gradients are not finite is skipped, not fatal (:mod:`rlkit.run.skipped_steps`): its
        prompts are consumed, nothing is applied, its metrics carry ``train/skipped_steps`` (the count so far)
        and go to the listeners like any step's. After ``grpo.max_consecutive_skipped_steps`` skipped steps in a
        row it raises SkippedStepsError; the steps taken are in ``history``.

        Ctrl-C or Jupyter's stop button raises :class:`rlkit.errors.RunInterrupted`, one line saying after which
        step it stopped: the interrupted step either took effect whole (and is recorded) or not at all, the
        finished steps are in ``session.history`` (the return value is lost with the interrupt), and the next
        ``run()`` or ``step()`` carries on from there."""
        return self.current.run(steps, progress, on_step)

    def request_stop(self) -> None:
        """Ask ``run()`` to end after the step it is in (what the dashboard's stop button calls)."""
        self.current.request_stop()

    def timed(self, part: str) -> Any:
        """Time a block as part ``part`` of the step under way (a listener's checkpoint save)."""
        return self.current.timed(part)

    def refit(self) -> Any:
        """Push the policy's weights into the generator. Interrupted midway, the generator stays stale."""
        return self.current.refit()

    def evaluate(self, num_prompts: Optional[int] = None, greedy: Optional[bool] = None) -> stages.EvalResult:
        """Held-out accuracy of the current policy (refits the generator first if it is stale)."""
        return self.current.evaluate(num_prompts, greedy)

    def sft(self, num_steps: Optional[int] = None, progress: bool = True, refit: bool = True) -> stages.SFTResult:
        """Supervised warm start on the task's answers; the result becomes the KL reference policy.

        Like ``step()``, it ends with a refit, so the next ``rollout()`` samples from the fine-tuned weights
        (SFT is a phase of its own, not one stage of an RL step). ``refit=False`` trains the policy only and
        leaves the generator stale, as ``train()`` does. Interrupted, SFT keeps the steps it took and the
        generator stays stale; ``step()`` and ``evaluate()`` refit first.
        """
        self.current.refuse_if_closed("sft")
        check_sft_columns(self.config, self.dataset)
        return self.current.sft(num_steps, progress, refit)

    def dpo(self, num_steps: Optional[int] = None, progress: bool = True, refit: bool = True,
            pairs: Optional[Sequence[Mapping[str, Any]]] = None) -> stages.DPOResult:
        """DPO steps (``dpo.*``) on preference pairs (``prompt``, ``chosen``, ``rejected``): ``pairs`` (e.g. the
        policy's own mistakes, ``rlkit.data.preference.pairs_from_batch(session.score(session.rollout(rows)))``),
        else ``dpo.train_file``, else pairs made from the task's integer answers (the answer chosen, a near miss
        rejected). The policy as the first call starts is the reference; later calls continue the pairs (new
        ``pairs`` replace them), optimizer and schedule, and the first RL update hands the RL optimizer back. Ends
        with a refit, as ``sft()`` (:mod:`rlkit.stages.dpo`)."""
        return self.current.dpo(num_steps, progress, refit, pairs)

    def train_reward_model(self, output: str | Path, pairs: Optional[Sequence[Mapping[str, Any]]] = None,
                           eval_pairs: Optional[Sequence[Mapping[str, Any]]] = None, base: Optional[str | Path] = None,
                           progress: bool = True) -> stages.RewardModelResult:
        """A reward model trained on preference pairs and saved to ``output``, where
        ``rlkit.envs.RewardModelEnvironment(output)`` loads it (``reward_model.*``; :mod:`rlkit.stages.reward_model`).
        Its base is ``base`` (a causal-LM folder), else the policy as it is now. Its pairs are ``pairs``, else
        ``dpo.train_file``'s, else the task's answers against near misses, with the held-out rows' likewise as
        ``eval_pairs`` (their pair accuracy is ``result.eval_accuracy``). The policy is not changed."""
        return self.current.train_reward_model(output, pairs, eval_pairs, base, progress)

    def openai_endpoint(self) -> Any:
        """An OpenAI-compatible chat endpoint over the engine, for agents (:func:`rlkit.stages.agent_rollout`) and
        chats from a cell: started on 127.0.0.1 on the first call, closed with the session
        (:mod:`rlkit.generation.openai_server`). Not while async GRPO's producer samples."""
        self.current.refuse_if_closed("openai_endpoint")
        return start_endpoint(self.components, self.config, self.sampling())

    def memory_plan(self):
        """The bytes this session's config needs per device and per part (:mod:`rlkit.memory.plan`)."""
        return plan_memory(self.config)

    # ---- what if: the Run's (rlkit.run.history, rlkit.run.replay, rlkit.stages.compare, rlkit.run.fork) ------
    def replay(self, step: int, loss: Any = None, estimator: Any = None, **overrides: Any) -> Any:
        """Step ``step`` recomputed on its stored batch and starting weights under another ``loss`` (a policy loss
        name brings its preset's companion settings, as in ``configure``), advantage ``estimator`` or ``loss_fn.*``
        ``overrides``: loss, per-token maps, gradient norm and its cosine to the gradient taken. The live session
        is not changed (:func:`rlkit.run.replay.replay`)."""
        return self.current.replay(step, loss, estimator, **{**self._companions(loss), **overrides})

    def compare_losses(self, batch: Optional[Trajectories] = None,
                       losses: Mapping[str, Any] | Sequence[str] = ("ppo_clip", "gspo", "cispo")) -> Any:
        """Several losses on one batch (default: the latest) at the current weights, per token and by gradient
        (:func:`rlkit.stages.compare.compare_losses`); ``losses``: policy loss names, or name -> name or loss."""
        return self.current.compare_losses(batch, losses, self._companions)

    def weights_at(self, step: Optional[int] = None) -> Any:
        """Which weights past steps started from exist: snapshots (replay's) and checkpoints
        (:func:`rlkit.run.history.weights_at`)."""
        return weights_at(self.store, self.config, step)

    def fork(self, n: Optional[int] = None) -> Any:
        """In-memory branches sharing the engines, each with its own weights, optimizer, run state, config and RNG
        (:mod:`rlkit.run.fork`): ``b = session.fork()``, ``a, b = session.fork(2)``; ``b.run(30)`` swaps b in."""
        return self.current.fork(n, facade=self)

    @property
    def branches(self) -> dict[str, Any]:
        """The branches by name ("main": the session's state before the first fork); one is active."""
        return self.current.branches(facade=self)

    def compare_branches(self, num_prompts: Optional[int] = None, greedy: Optional[bool] = None) -> Any:
        """Held-out accuracy of every branch on the same prompts, as a DataFrame (:func:`rlkit.run.fork.compare_branches`)."""
        return self.current.compare_branches(self, num_prompts, greedy)

    def _companions(self, loss: Any) -> dict[str, Any]:
        """The ``loss_fn.*`` settings (prefix removed) a switch to policy loss ``loss`` brings (builders.loss_companions)."""
        return {k.removeprefix("loss_fn."): v for k, v in loss_companions(self.config, {"loss_fn.policy_loss": loss}).items()}

    # ---- notebook and checkpoints ----------------------------------------------------------------
    def dashboard(self) -> Any:
        """A live widget (plots of reward, KL, entropy, clipping, lengths, stage times; latest samples;
        a stop button) that updates during ``run()``. Falls back to text without ipywidgets."""
        self.current.refuse_if_closed("dashboard")
        return Dashboard(self.current)

    def save(self, path: str | Path, extra: Optional[Mapping[str, Any]] = None) -> Path:
        """Write a checkpoint (weights, optimizer, scheduler, RNG, data position, step, config, which environment;
        ``extra``: JSON-able, kept beside them) atomically (:mod:`rlkit.tracking.checkpoint`)."""
        return self.current.save(path, {**dict(extra or {}), "environment": self.environment_record()})

    def restore(self, path: str | Path) -> dict[str, Any]:
        """Put the checkpoint at ``path`` (made by a session of a matching config) into this one: weights,
        optimizer, run state and RNG as they were saved, the generator refit. Returns its ``state.json``."""
        self.current.refuse_if_closed("restore")
        return self.current.restore(path)

    def environment_record(self) -> dict[str, Any]:
        """What a checkpoint keeps of the environment, so that :meth:`load` can build it again
        (:func:`rlkit.builders.environment_record`)."""
        return environment_record(self.env, self.components.config_env)

    @classmethod
    def load(cls, path: str | Path, env: Any = None, config: Any = None, overrides: Sequence[str] | Mapping = (),
             **kwargs: Any) -> "Session":
        """A session restored from ``save(path)``; the next step continues exactly where it left off.

        Built from the checkpoint's config (or ``config``, e.g. to extend a run; plus ``overrides``). The
        environment is the one the checkpoint was made with: the config's (``env.name``, ``env.reward_fn``),
        or a reward function of yours imported again by its path; one that cannot be built again (a function
        defined in a notebook) is refused with the fix, ``Session.load(path, env=...)``. ``env`` replaces it;
        ``kwargs`` go to the constructor (``loss_fn=``, ``verbose=``)."""
        state = read_checkpoint_state(path)
        if env is None:
            env = saved_environment(state, path)
        session = cls(checkpoint_config(state["folder"], config, overrides), env=env, **kwargs)
        try:
            session.restore(state["folder"])
        except BaseException:
            session.close()
            raise
        return session

    def export_hf(self, path: str | Path) -> Path:
        """The policy's current weights (merged) as an HF model folder that transformers and vLLM load, with the
        model folder's config and tokenizer files, written atomically (:func:`rlkit.tracking.checkpoint.export_hf`)."""
        self.current.refuse_if_closed("export_hf")
        return export_hf(self.policy, self.config.policy, path)

    # ---- records ---------------------------------------------------------------------------------
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
        self.current.refuse_if_closed("log_to")
        overrides = {k: v for k, v in (("logger.log_dir", None if log_dir is None else str(log_dir)),
                                       ("logger.wandb_enabled", wandb)) if v is not None}
        if overrides:
            rebuild(self.current, overrides, "log_to()", refused=set(Change) - {Change.LIVE})
        self.stop_logging()
        folder = Path(run_dir) if run_dir is not None else Path(self.config.logger.log_dir) / self.config.name
        if run_dir is None and (folder / "metrics.jsonl").is_file() and (folder / "metrics.jsonl").stat().st_size:
            warnings.warn(f"{folder} holds an earlier run's records (the folder is logger.log_dir/name, and name is "
                          f"the preset's unless set): they are replaced. To keep both, pass "
                          f"Session.from_config(..., {{'name': 'my-run'}}) or log_to(run_dir=...)", stacklevel=2)
        self.current.records = RunRecorder(folder, self.config)
        self._records_folder_fixed = run_dir is not None
        return folder

    def stop_logging(self) -> None:
        """Finish the records (close the files, finish the wandb run); the session stops recording. Safe twice."""
        if self.current.records is not None:
            self.current.records.finish()
        self.current.records = None

    def _follow_logger_change(self, old: RunConfig) -> None:
        """``configure()`` of ``logger.*`` or ``name``: a session that did not record starts (into the new folder);
        one that does moves to the new folder when it changed, else its loggers follow at the next record."""
        folder = Path(self.config.logger.log_dir) / self.config.name
        moved = folder != Path(old.logger.log_dir) / old.name and not self._records_folder_fixed
        if self.records is None or moved:
            print(f"recording into {self.log_to()}")

    # ---- lifecycle -------------------------------------------------------------------------------
    def close(self) -> None:
        """Release the generator, the policy, their process groups and Megatron's global state; a new Session
        can follow. Safe twice."""
        self.current.close()

    def __enter__(self) -> "Session":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        return session_summary(self.current, self.startup)

    def _repr_html_(self) -> str:
        return session_html(self.current, self.startup)  # rlkit.notebook.display: the card
