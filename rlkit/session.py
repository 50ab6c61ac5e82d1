"""The Session: a policy, a reference, a generator, an environment and prompt data, alive in one process.

The session is thin on purpose. Each stage method calls the stage function of the same name in
:mod:`rlkit.stages` and keeps the result, so a notebook can re-run any cell; nothing here computes a
loss or an advantage itself. It also keeps the bookkeeping a researcher should not have to: which policy
version the generator holds (``stale``), which prompts the current step uses, and the step history.

Re-running ``rollout()`` within a step returns the same prompts and samples (same seed, same weights);
the step's prompts are consumed when ``train()`` completes.
"""

from __future__ import annotations

import time
from dataclasses import replace
import warnings
from pathlib import Path
from contextlib import nullcontext
from typing import Any, Callable, ContextManager, Mapping, Optional, Sequence

from rlkit import stages
from rlkit.algorithms import RLLoss, RunningBaseline
from rlkit.config.loading import load_config
from rlkit.config.run import RunConfig
from rlkit.generation.base import SamplingSettings
from rlkit.stages.async_rollouts import AsyncRollouts, updates_per_step
from rlkit.stages.metrics import StepMetrics, step_metrics
from rlkit.trajectories import Trajectories


# Config sections (or dotted prefixes) that reset() can switch to without rebuilding any engine.
RESETTABLE = ("name", "seed", "grpo", "loss_fn", "sft", "eval", "logger", "checkpointing",
              "policy.optimizer", "policy.scheduler")


def _without_resettable(config: RunConfig) -> dict[str, Any]:
    raw = config.model_dump(mode="json")
    async_grpo = raw["grpo"].get("async_grpo")  # a session's producer thread exists or not from construction
    for key in RESETTABLE:
        node = raw
        *parents, leaf = key.split(".")
        for part in parents:
            node = node[part]
        node.pop(leaf, None)
    raw["async_grpo"] = async_grpo
    return raw


def _changed_keys(old: Any, new: Any, prefix: str = "") -> list[str]:
    """Dotted keys whose values differ between two nested dicts."""
    if not (isinstance(old, dict) and isinstance(new, dict)):
        return [prefix] if old != new else []
    return [k for key in sorted(set(old) | set(new))
            for k in _changed_keys(old.get(key), new.get(key), f"{prefix}.{key}" if prefix else key)]


def can_reset(old: RunConfig, new: RunConfig) -> bool:
    """True when a session built for ``old`` can ``reset(new)`` (only :data:`RESETTABLE` keys differ)."""
    return _without_resettable(old) == _without_resettable(new)


def seed_everything(seed: int) -> None:
    """Seed the RNGs a fresh session seeds at construction: python, numpy, torch, and Megatron's tracker when
    a Megatron policy lives in this process (not for DTensor or a Ray worker group)."""
    import random

    import numpy as np
    import torch
    from megatron.core import parallel_state
    from megatron.core.tensor_parallel import model_parallel_cuda_manual_seed

    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)
    if parallel_state.model_parallel_is_initialized():
        model_parallel_cuda_manual_seed(seed)


class Session:
    """Holds the components of an RL run and exposes one method per stage."""

    def __init__(self, config: RunConfig, env: Any = None, loss_fn: Optional[Callable] = None):
        from transformers import AutoTokenizer

        from rlkit.builders import build_environment, build_generation, build_policy, ensure_model
        from rlkit.data import PromptSampler, load_prompt_dataset

        self.config = config
        ensure_model(config)
        self.tokenizer = AutoTokenizer.from_pretrained(config.policy.model_name)
        self.dataset = load_prompt_dataset(config.data)
        self.sampler = PromptSampler(self.dataset["train"], config.grpo.num_prompts_per_step, seed=config.seed)
        self.env = env if env is not None else build_environment(config)
        self.policy = build_policy(config)
        self.generator, self.weight_sync = build_generation(config)  # the engine and what refits it, one pair
        self.generator_version = self.policy.version
        a = config.grpo.async_grpo  # async GRPO: a background producer samples later steps' rollouts
        self.rollouts = AsyncRollouts(self._sample_async_batch, a.max_trajectory_age_steps,
                                      self.generator_version) if a.enabled else None
        self.loss_fn = loss_fn if loss_fn is not None else RLLoss(config.loss_fn, kl_in_reward=config.grpo.reward_kl_coef > 0)
        self.baseline = RunningBaseline()
        self.step_count = 0
        self.history: list[StepMetrics] = []
        self.batch: Optional[Trajectories] = None
        self.last_train = self.last_refit = self.last_eval = self.last_sft = None
        self._step_rows: Optional[list[dict]] = None
        self._timings: dict[str, float] = {}
        self.stop_requested = False
        self.listeners: list[Callable[[StepMetrics], None]] = []  # called after every step of run()

    @classmethod
    def from_config(cls, source: str | Path | Mapping = "quickstart", overrides: Sequence[str] | Mapping = (),
                    **kwargs: Any) -> "Session":
        """A session from a shipped preset name, a YAML path or a mapping, with dotted overrides
        (``["grpo.num_generations_per_prompt=8"]`` or ``{"grpo.num_generations_per_prompt": 8}``)."""
        return cls(load_config(source, overrides), **kwargs)

    LIVE_SECTIONS = ("name", "grpo", "loss_fn", "eval", "logger", "checkpointing")  # changeable without restart

    def configure(self, overrides: Sequence[str] | Mapping[str, Any] | RunConfig) -> RunConfig:
        """Change algorithm settings in place (``grpo.*``, ``loss_fn.*``, ``eval.*`` ...) without restarting
        the engines, e.g. ``session.configure(["loss_fn.policy_loss=gspo"])``. Returns the new config.
        Changes to the model, generator, data or environment need a new Session and raise ConfigError."""
        from rlkit.algorithms import RLLoss
        from rlkit.errors import ConfigError

        new = overrides if isinstance(overrides, RunConfig) else load_config(self.config.model_dump(), overrides)
        frozen = [k for k in RunConfig.model_fields if k not in self.LIVE_SECTIONS and getattr(new, k) != getattr(self.config, k)]
        if new.grpo.async_grpo != self.config.grpo.async_grpo:
            frozen.append("grpo.async_grpo")
        if frozen:
            raise ConfigError([f"{k}: changing it needs a new Session (Session.from_config(..., overrides=...)); "
                               f"in place only {', '.join(self.LIVE_SECTIONS)} can change" for k in frozen])
        self.config = new
        self.loss_fn = RLLoss(new.loss_fn, kl_in_reward=new.grpo.reward_kl_coef > 0)
        return new

    def reset(self, config: Sequence[str] | Mapping[str, Any] | RunConfig = ()) -> "Session":
        """Put the session in the state ``Session(config)`` would start in, keeping its engines (a sweep does
        this between runs: starting vLLM and Megatron costs far more than a short run).

        ``config`` is a RunConfig or overrides of the current config (default: none, i.e. start this run
        over). It may change only :data:`RESETTABLE` keys (seed, ``grpo.*`` except ``grpo.async_grpo``,
        ``loss_fn.*``, ``sft.*``, ``eval.*``, ``logger.*``, ``checkpointing.*``, ``policy.optimizer.*``,
        ``policy.scheduler.*``); anything else raises ConfigError. Weights come back from the model folder
        (the policy, then the generator by a refit) and become the reference; the optimizer and schedule are
        new; the sampler starts over with the seed; loss function and baseline are rebuilt; step count,
        history and latest results are cleared; the RNGs are seeded as at construction. Listeners (a
        dashboard) stay attached."""
        from rlkit.algorithms import RLLoss, RunningBaseline
        from rlkit.data import PromptSampler
        from rlkit.errors import ConfigError
        from rlkit.policy.megatron.policy import load_hf_state

        new = config if isinstance(config, RunConfig) else load_config(self.config.model_dump(), config)
        if not can_reset(self.config, new):
            changed = _changed_keys(_without_resettable(self.config), _without_resettable(new))
            raise ConfigError([f"{k}: changing it needs a new Session (Session.from_config(...)); reset() can "
                               f"change only {', '.join(RESETTABLE)} (not grpo.async_grpo)" for k in changed])
        policy = self.policy
        policy.load_hf_state(load_hf_state(new.policy.model_name))
        policy.reset_optimizer(new.policy.optimizer, new.policy.scheduler)
        policy.set_reference_to_current()
        policy.version = 0
        self.config = new
        self.sampler = PromptSampler(self.dataset["train"], new.grpo.num_prompts_per_step, seed=new.seed)
        self.loss_fn = RLLoss(new.loss_fn, kl_in_reward=new.grpo.reward_kl_coef > 0)
        self.baseline = RunningBaseline()
        self.step_count = 0
        self.history = []
        self.batch = None
        self.last_train = self.last_refit = self.last_eval = self.last_sft = None
        self._step_rows = None
        self._timings = {}
        self.stop_requested = False
        self.refit()
        if self.rollouts is not None:  # async GRPO: drop batches sampled for the previous run
            old = self.rollouts
            old.close()
            self.rollouts = AsyncRollouts(old.make_batch, old.max_age_steps, self.generator_version)
        seed_everything(new.seed)
        return self

    # ---- state -----------------------------------------------------------------------------------
    @property
    def stale(self) -> bool:
        """True when the generator holds older weights than the policy (call ``refit()``)."""
        return self.generator_version != self.policy.version

    def _latest(self, batch: Optional[Trajectories], stage: str) -> Trajectories:
        if batch is not None:
            return batch
        if self.batch is None:
            from rlkit.errors import StageOrderError

            raise StageOrderError(f"no rollout yet: call session.rollout() before session.{stage}()")
        return self.batch

    def _keep(self, batch: Trajectories) -> Trajectories:
        self.batch = batch
        return batch

    def sampling(self, seed: Optional[int] = None) -> SamplingSettings:
        g = self.config.policy.generation
        return SamplingSettings(g.temperature, g.top_p, g.top_k, g.max_new_tokens, g.stop_strings,
                                seed=self.config.seed * 1_000_003 + self.step_count if seed is None else seed)

    # ---- stages ----------------------------------------------------------------------------------
    def rollout(self, rows: Optional[Sequence[dict]] = None, seed: Optional[int] = None) -> Trajectories:
        """Sample G completions for this step's prompts (or for ``rows``). With async GRPO: the next ready
        batch from the background producer (the same one again within a step; ``seed`` is not used)."""
        g = self.config.grpo
        if self.rollouts is not None and rows is None:
            ups = updates_per_step(g.num_prompts_per_step * g.num_generations_per_prompt,
                                   self.config.policy.train_global_batch_size, g.num_epochs)
            return self._keep(self.rollouts.batch_for_step(self.step_count, self.policy.version, ups))
        if self.stale:
            warnings.warn(f"the generator holds policy version {self.generator_version}, the policy is at "
                          f"{self.policy.version}: these samples are off-policy (call session.refit() first)",
                          stacklevel=2)
        if g.use_dynamic_sampling and rows is None:
            if self._step_rows is None:
                self._step_rows = [self.sampler.next_batch() for _ in range(g.dynamic_sampling_max_gen_batches)]
            return self._keep(self._dynamic_rollout(self._step_rows, self.sampling(seed).seed, self.generator_version))
        if rows is None:
            if self._step_rows is None:
                self._step_rows = self.sampler.next_batch()
            rows = self._step_rows
        with self._generator_lock():
            batch = stages.rollout(self.generator, self.tokenizer, rows, g.num_generations_per_prompt,
                                   self.sampling(seed), self.generator_version, self.config.data.system_prompt)
        return self._keep(batch)

    def _sample_async_batch(self, index: int, version: int) -> Trajectories:
        """Async GRPO's producer thread: batch ``index`` (the prompts and seed sync step ``index`` would use)."""
        g = self.config.grpo
        seed = self.config.seed * 1_000_003 + index
        if g.use_dynamic_sampling:
            tries = [self.sampler.next_batch() for _ in range(g.dynamic_sampling_max_gen_batches)]
            return self._dynamic_rollout(tries, seed, version)
        return stages.rollout(self.generator, self.tokenizer, self.sampler.next_batch(), g.num_generations_per_prompt,
                              self.sampling(seed), version, self.config.data.system_prompt)

    def _generator_lock(self) -> ContextManager:
        """Exclusive use of the generator: async GRPO's producer may be sampling in the background."""
        return self.rollouts.exclusive() if self.rollouts is not None else nullcontext()

    def _dynamic_rollout(self, tries: Sequence[Sequence[dict]], base_seed: int, version: int) -> Trajectories:
        """DAPO: rounds of fresh prompts (``tries``), scored, keeping groups whose rewards vary (returns a
        scored batch). Also runs in async GRPO's producer thread, so it keeps nothing on the session."""
        g = self.config.grpo

        def sample_and_score(attempt: int) -> Trajectories:
            batch = stages.rollout(self.generator, self.tokenizer, tries[attempt], g.num_generations_per_prompt,
                                   replace(self.sampling(), seed=base_seed + 7919 * attempt), version,
                                   self.config.data.system_prompt)
            return stages.score(batch, self.env, g.overlong_buffer_length, g.overlong_penalty,
                                self.config.policy.generation.max_new_tokens)

        return stages.dynamic_sampling(sample_and_score, g.num_prompts_per_step, g.dynamic_sampling_max_gen_batches)

    def score(self, batch: Optional[Trajectories] = None) -> Trajectories:
        g = self.config.grpo
        return self._keep(stages.score(self._latest(batch, "score"), self.env, g.overlong_buffer_length,
                                       g.overlong_penalty, self.config.policy.generation.max_new_tokens))

    def advantages(self, batch: Optional[Trajectories] = None) -> Trajectories:
        g = self.config.grpo
        return self._keep(stages.advantages(self._latest(batch, "advantages"), g.advantage_estimator,
                                            g.advantage_params(), self.baseline))

    def logprobs(self, batch: Optional[Trajectories] = None) -> Trajectories:
        needs_reference = getattr(self.loss_fn, "needs_reference", True)
        return self._keep(stages.logprobs(self._latest(batch, "logprobs"), self.policy, needs_reference,
                                          self.config.grpo.mismatch_warning_threshold))

    def loss(self, batch: Optional[Trajectories] = None) -> stages.LossReport:
        """The loss and metrics on the batch under the current weights; no step is taken."""
        return stages.loss(self._latest(batch, "loss"), self.policy, self.loss_fn)

    def train(self, batch: Optional[Trajectories] = None) -> StepMetrics:
        """Loss and optimizer step(s) on the batch; completes the RL step and records its metrics.

        Interrupted (Ctrl-C, Jupyter's stop) after an update took effect, the step is still recorded (step
        count, history with ``train/interrupted`` = 1, next step's prompts) before the interrupt propagates;
        interrupted before any update, nothing is recorded and the same call can simply be repeated."""
        batch = self._latest(batch, "train")
        version_before = self.policy.version
        try:
            result = stages.train(batch, self.policy, self.loss_fn, self.config.grpo.num_epochs,
                                  self.config.policy.train_global_batch_size, seed=self.config.seed + self.step_count)
        except stages.TrainInterrupted as interrupted:
            self._record_step(batch, interrupted.metrics(), interrupted.seconds, version_before)
            raise
        self.last_train = result
        return self._record_step(batch, result.metrics, result.seconds, version_before)

    def _record_step(self, batch: Trajectories, train_metrics: dict[str, float], seconds: float,
                     version_before: int) -> StepMetrics:
        self.step_count += 1
        self._step_rows = None
        timings = {k: v for k, v in batch.info.items() if k.startswith("timing/")}
        timings["timing/train"] = seconds
        metrics = step_metrics(self.step_count, self.policy.version, batch, train_metrics, timings, version_before)
        metrics.values.update({k: v for k, v in batch.info.items() if k.startswith("rollout/")})  # async producer's
        self.history.append(metrics)
        return metrics

    def refit(self) -> Any:
        """Push the policy's weights into the generator. Interrupted midway, the generator stays stale."""
        self.generator_version = -1  # unknown mixture until the sync completes
        with self._generator_lock():
            report = stages.refit(self.policy, self.generator, self.weight_sync)
        self.generator_version = report.policy_version
        if self.rollouts is not None:
            self.rollouts.weights_loaded(report.policy_version, self.step_count)
        self.last_refit = report
        return report

    def step(self) -> StepMetrics:
        """One whole RL step: rollout, score, advantages, logprobs, train, refit."""
        t0 = time.perf_counter()
        if self.stale:
            self.refit()
        batch = self.rollout()
        # logprobs before advantages: estimators that fold KL into the reward need the reference logprobs
        batch = self.advantages(self.logprobs(batch if batch.rewards is not None else self.score(batch)))
        metrics = self.train(batch)
        report = self.refit()
        metrics.values["timing/refit"] = report.seconds
        if self.rollouts is not None:  # the refit first waited for the batch being sampled
            metrics.values["timing/refit_wait"] = self.rollouts.last_exclusive_wait
        metrics.values["timing/step_total"] = elapsed = time.perf_counter() - t0
        metrics.values["timing/samples_per_second"] = batch.batch_size / elapsed
        metrics.values["timing/tokens_per_second"] = float(batch.completion_lengths.sum()) / elapsed
        return metrics

    def run(self, steps: Optional[int] = None, progress: bool = True,
            on_step: Optional[Callable[[StepMetrics], None]] = None) -> list[StepMetrics]:
        """``steps`` RL steps (default ``grpo.max_num_steps``) with a progress bar; ``request_stop()``
        (or the dashboard's stop button) ends the loop after the current step."""
        from tqdm.auto import tqdm

        total = self.config.grpo.max_num_steps if steps is None else steps
        self.stop_requested = False
        done = []
        bar = tqdm(range(total), desc="GRPO", disable=not progress, leave=True)
        for _ in bar:
            metrics = self.step()
            done.append(metrics)
            shown = {"reward": f"{metrics['rollout/reward_mean']:.3f}",
                     "entropy": f"{metrics.get('train/approx_entropy', float('nan')):.3f}"}
            if getattr(self.loss_fn, "needs_reference", False):
                shown["kl"] = f"{metrics.get('train/kl', 0.0):.4f}"
            bar.set_postfix(shown)
            period = self.config.grpo.val_period
            if period and self.step_count % period == 0:
                metrics.values["validation/accuracy"] = self.evaluate().accuracy
            for listener in ([on_step] if on_step else []) + self.listeners:
                listener(metrics)
            if self.stop_requested:
                break
        return done

    def request_stop(self) -> None:
        self.stop_requested = True

    def evaluate(self, num_prompts: Optional[int] = None, greedy: Optional[bool] = None) -> stages.EvalResult:
        """Held-out accuracy of the current policy (refits the generator first if it is stale)."""
        if self.stale:
            self.refit()
        n = num_prompts or self.config.eval.num_prompts
        rows = list(self.dataset["validation"].select(range(min(n, len(self.dataset["validation"])))))
        with self._generator_lock():
            self.last_eval = stages.evaluate(
                self.generator, self.tokenizer, self.env, rows, self.config.policy.generation.max_new_tokens,
                self.policy.version, greedy=self.config.eval.greedy if greedy is None else greedy,
                seed=self.config.seed, system_prompt=self.config.data.system_prompt,
            )
        return self.last_eval

    def sft(self, num_steps: Optional[int] = None, progress: bool = True, refit: bool = True) -> stages.SFTResult:
        """Supervised warm start on the task's answers; the result becomes the KL reference policy.

        Like ``step()``, it ends with a refit, so the next ``rollout()`` samples from the fine-tuned weights
        (SFT is a phase of its own, not one stage of an RL step). ``refit=False`` trains the policy only and
        leaves the generator stale, as ``train()`` does. Interrupted, SFT keeps the steps it took and the
        generator stays stale; ``step()`` and ``evaluate()`` refit first.
        """
        from tqdm.auto import tqdm

        from rlkit.data import PromptSampler

        cfg = self.config.sft if num_steps is None else self.config.sft.model_copy(update={"num_steps": num_steps})
        sampler = PromptSampler(self.dataset["train"], cfg.batch_size, seed=self.config.seed + 1)
        bar = tqdm(total=cfg.num_steps, desc="SFT", disable=not progress)

        def on_step(step: int, loss: float) -> None:
            bar.update(1)
            bar.set_postfix(loss=f"{loss:.4f}")

        try:
            self.last_sft = stages.sft(self.policy, self.tokenizer, sampler, cfg, self.config.policy.optimizer,
                                       self.config.policy.scheduler, self.config.data.system_prompt, on_step)
        finally:
            bar.close()
        if refit:
            self.refit()
        return self.last_sft

    # ---- notebook and checkpoints ----------------------------------------------------------------
    def dashboard(self) -> Any:
        """A live widget (plots of reward, KL, entropy, clipping, lengths, stage times; latest samples;
        a stop button) that updates during ``run()``. Falls back to text without ipywidgets."""
        from rlkit.notebook.dashboard import Dashboard

        return Dashboard(self)

    def save(self, path: str | Path) -> Path:
        """Write a checkpoint (weights, optimizer, scheduler, RNG, data position, step, config) atomically."""
        from rlkit.tracking.checkpoint import save_session

        return save_session(self, path)

    @classmethod
    def load(cls, path: str | Path, **kwargs: Any) -> "Session":
        """A session restored from ``save(path)``; the next step continues exactly where it left off."""
        from rlkit.tracking.checkpoint import load_session

        return load_session(cls, path, **kwargs)

    # ---- lifecycle -------------------------------------------------------------------------------
    def close(self) -> None:
        """Release the generator, the policy and Megatron's global state; a new Session can follow."""
        for part in ("rollouts", "generator", "weight_sync", "policy", "env"):
            component = getattr(self, part, None)
            if component is not None and hasattr(component, "close"):
                component.close()
            setattr(self, part, None)

    def __enter__(self) -> "Session":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        from rlkit.notebook.display import session_summary

        return session_summary(self)

    def _repr_html_(self) -> str:
        from rlkit.notebook.display import session_html

        return session_html(self)
