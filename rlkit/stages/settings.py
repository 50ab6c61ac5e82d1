"""What each stage reads from the run config: one frozen settings object per stage, built by ``from_config``.

A session builds them once per config (``session.settings``); a stage called without a session takes one
directly, e.g. ``stages.rollout(generator, tokenizer, rows, sampling, 0, RolloutSettings(num_generations=4))``.
The sampling settings (:class:`rlkit.generation.base.SamplingSettings`) are apart: their seed changes each step.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Any, Optional

from rlkit.config.components import OptimizerConfig, SchedulerConfig
from rlkit.config.run import DPOConfig, RunConfig, SFTConfig
from rlkit.envs.base import MAX_REWARD_FAILURE_FRACTION
from rlkit.envs.registry import environment_tool_schemas


@dataclass(frozen=True)
class RolloutSettings:
    """:func:`rlkit.stages.rollout` and :func:`rlkit.stages.conversations`."""

    num_generations: int = 1  # G: samples (conversations) per prompt
    system_prompt: Optional[str] = None
    max_total_tokens: Optional[int] = None  # a conversation's tokens (the engine's length): conversations need it
    max_failure_fraction: float = MAX_REWARD_FAILURE_FRACTION  # conversations with an environment failure
    max_turns: Optional[int] = None  # a conversation's assistant turns (default: env.max_turns)
    prompt_key: str = "prompt"
    chat_template_kwargs: Optional[dict[str, Any]] = None  # data.chat_template_kwargs, e.g. {"enable_thinking": False}
    # JSON tool declarations rendered by the template (tools=); a native-tool environment's own take precedence
    tools: Optional[tuple[dict[str, Any], ...]] = None

    @classmethod
    def from_config(cls, config: RunConfig) -> "RolloutSettings":
        return cls(config.grpo.num_generations_per_prompt, config.data.system_prompt, config.policy.max_model_len,
                   config.env.max_reward_failure_fraction, chat_template_kwargs=dict(config.data.chat_template_kwargs),
                   tools=_tools_of(config))


@dataclass(frozen=True)
class ScoreSettings:
    """:func:`rlkit.stages.score`: DAPO's soft overlong punishment (off without a buffer) and failed rewards."""

    overlong_buffer_length: Optional[int] = None
    overlong_penalty: float = 1.0
    max_new_tokens: Optional[int] = None  # the completion length the overlong buffer ends at
    max_failure_fraction: float = MAX_REWARD_FAILURE_FRACTION  # more failed samples raise RewardError

    @classmethod
    def from_config(cls, config: RunConfig) -> "ScoreSettings":
        g = config.grpo
        return cls(g.overlong_buffer_length, g.overlong_penalty, config.policy.generation.max_new_tokens,
                   config.env.max_reward_failure_fraction)


@dataclass(frozen=True)
class EvalSettings:
    """:func:`rlkit.stages.evaluate`: one completion per held-out prompt, greedy or sampled, under the training
    rollouts' generation settings (``policy.generation``): the same stop strings, and when sampled the same
    temperature, top-p and top-k, so held-out accuracy measures the policy as it is sampled in training."""

    max_new_tokens: int
    num_prompts: int  # held-out prompts the session evaluates on
    greedy: bool = True
    seed: int = 0
    rollout: RolloutSettings = field(default_factory=RolloutSettings)  # with num_generations 1
    chunk: int = 256  # prompts per engine call
    temperature: float = 1.0  # when not greedy
    top_p: float = 1.0
    top_k: Optional[int] = None
    stop_strings: tuple[str, ...] = ()

    @classmethod
    def from_config(cls, config: RunConfig) -> "EvalSettings":
        g = config.policy.generation
        return cls(g.max_new_tokens, config.eval.num_prompts, config.eval.greedy, config.seed,
                   replace(RolloutSettings.from_config(config), num_generations=1), temperature=g.temperature,
                   top_p=g.top_p, top_k=g.top_k, stop_strings=tuple(g.stop_strings))


@dataclass(frozen=True)
class TrainSettings:
    """:func:`rlkit.stages.train`: ``num_epochs`` passes in minibatches of ``global_batch_size`` rows."""

    num_epochs: int = 1
    global_batch_size: Optional[int] = None  # None: the whole batch, one optimizer step per epoch

    @classmethod
    def from_config(cls, config: RunConfig) -> "TrainSettings":
        return cls(config.grpo.num_epochs, config.policy.train_global_batch_size)


@dataclass(frozen=True)
class SFTSettings:
    """:func:`rlkit.stages.sft`: its own steps and optimizer, and the RL optimizer and schedule it hands back."""

    sft: SFTConfig
    rl_optimizer: OptimizerConfig
    rl_scheduler: SchedulerConfig
    system_prompt: Optional[str] = None
    chat_template_kwargs: Optional[dict[str, Any]] = None  # data.chat_template_kwargs
    tools: Optional[tuple[dict[str, Any], ...]] = None  # the environment's JSON tools, rendered into the prompt

    @classmethod
    def from_config(cls, config: RunConfig, num_steps: Optional[int] = None) -> "SFTSettings":
        sft = config.sft if num_steps is None else config.sft.model_copy(update={"num_steps": num_steps})
        return cls(sft, config.policy.optimizer, config.policy.scheduler, config.data.system_prompt,
                   dict(config.data.chat_template_kwargs), _tools_of(config))


@dataclass(frozen=True)
class DPOSettings:
    """:func:`rlkit.stages.dpo`: its steps, loss and optimizer; prompts rendered and the RL optimizer handed back
    as SFT's (``sft``)."""

    dpo: DPOConfig
    sft: SFTSettings

    @classmethod
    def from_config(cls, config: RunConfig, num_steps: Optional[int] = None) -> "DPOSettings":
        dpo = config.dpo if num_steps is None else config.dpo.model_copy(update={"num_steps": num_steps})
        return cls(dpo, SFTSettings.from_config(config))


def _tools_of(config: RunConfig) -> Optional[tuple[dict[str, Any], ...]]:
    """The JSON tools of ``env.name``'s environment (None without native tools, or with ``env.reward_fn`` or
    ``env.rewards``)."""
    own = config.env.reward_fn is not None or config.env.rewards  # then env.name is not read
    schemas = None if own else environment_tool_schemas(config.env.name)
    return tuple(schemas) if schemas else None


@dataclass(frozen=True)
class StageSettings:
    """Every stage's settings from one config."""

    rollout: RolloutSettings
    score: ScoreSettings
    eval: EvalSettings
    train: TrainSettings
    sft: SFTSettings

    @classmethod
    def from_config(cls, config: RunConfig) -> "StageSettings":
        return cls(*(kind.from_config(config) for kind in (RolloutSettings, ScoreSettings, EvalSettings,
                                                            TrainSettings, SFTSettings)))
