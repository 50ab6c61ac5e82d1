"""The run config: one typed section per component, composed. NeMo-RL's key names where it has them.

Sections whose knobs belong to a pure-function layer reuse that layer's own frozen dataclass
(``loss_fn`` is :class:`rlkit.algorithms.LossParams`, ``data`` is :class:`rlkit.data.DataParams`), so each
default is written exactly once.
"""

from __future__ import annotations

from typing import Literal, Optional

from pydantic import Field, ValidationInfo, field_validator, model_validator
from pydantic_core import PydanticCustomError

from rlkit.algorithms import AdvantageEstimatorName, AdvantageParams, DistillationParams, KLEstimatorName, LossParams
from rlkit.data import DataParams
from rlkit.envs.answers import ANSWER_FROM_ENVS, AnswerFrom
from rlkit.envs.base import MAX_REWARD_FAILURE_FRACTION
from rlkit.envs.registry import EnvironmentName
from rlkit.config.components import PolicyConfig, generation_colocated
from rlkit.config.section import Section

_ADV = AdvantageParams()
_DISTILL = DistillationParams()


class AsyncGRPOConfig(Section):
    """Rollouts of later steps are generated while the policy trains (NeMo-RL's ``grpo.async_grpo``)."""

    enabled: bool = False
    max_trajectory_age_steps: int = Field(1, ge=1)  # a batch is trained at most this many steps after its weights


class GRPOConfig(Section):
    """The RL loop: prompts and samples per step, advantages, epochs, DAPO's dynamic sampling, async GRPO."""

    num_prompts_per_step: int = Field(16, ge=1)
    num_generations_per_prompt: int = Field(8, ge=1)
    max_num_steps: int = Field(100, ge=0)
    advantage_estimator: AdvantageEstimatorName = "grpo"
    normalize_rewards: bool = _ADV.normalize_rewards
    use_leave_one_out_baseline: bool = _ADV.use_leave_one_out_baseline
    reward_kl_coef: float = Field(_ADV.kl_coef, ge=0)  # REINFORCE++: KL folded into the reward
    baseline_momentum: float = Field(_ADV.baseline_momentum, ge=0, lt=1)
    gamma: float = Field(_ADV.gamma, ge=0, le=1)  # reinforce_pp and gae: discount over the policy's tokens
    gae_lambda: float = Field(_ADV.gae_lambda, ge=0, le=1)  # gae: GAE's lambda (needs critic.enabled)
    num_epochs: int = Field(1, ge=1)  # optimizer passes over each rollout (PPO epochs)
    use_dynamic_sampling: bool = False  # DAPO: drop zero-variance groups and sample again until full
    dynamic_sampling_max_gen_batches: int = Field(4, ge=1)
    overlong_buffer_length: Optional[int] = Field(None, ge=1)  # DAPO soft overlong punishment
    overlong_penalty: float = Field(1.0, ge=0)
    val_period: int = Field(0, ge=0)  # steps between held-out evaluations during run(); 0: only at the ends
    mismatch_warning_threshold: float = Field(1e-2, gt=0)  # warn when |token_mult_prob_error - 1| exceeds
    # run() skips a step whose gradients are not finite and stops after this many in a row (SkippedStepsError)
    max_consecutive_skipped_steps: int = Field(3, ge=1)
    async_grpo: AsyncGRPOConfig = AsyncGRPOConfig()

    def advantage_params(self) -> AdvantageParams:
        """The settings the advantage estimators read, as their own dataclass."""
        return AdvantageParams(
            normalize_rewards=self.normalize_rewards,
            use_leave_one_out_baseline=self.use_leave_one_out_baseline,
            kl_coef=self.reward_kl_coef,
            gamma=self.gamma,
            gae_lambda=self.gae_lambda,
            baseline_momentum=self.baseline_momentum,
        )


class RewardComponentConfig(Section):
    """One weighted part of ``env.rewards``: a reward function by import path (``fn``) or an environment by name
    (``env``), its weight, and the name its metric is logged under (``rollout/reward/<name>_mean``)."""

    fn: Optional[str] = Field(None, pattern=r"^[A-Za-z_][\w.]*:[A-Za-z_][\w.]*$")
    env: Optional[EnvironmentName] = None
    weight: float = 1.0
    name: Optional[str] = None

    @model_validator(mode="after")
    def _one_source(self) -> "RewardComponentConfig":
        if (self.fn is None) == (self.env is None):
            raise ValueError("give exactly one of fn ('module:function', a reward function of yours) or env (an "
                             "environment by name)")
        return self


class EnvConfig(Section):
    name: EnvironmentName = "arithmetic"
    # a reward function of yours by import path, "module:function" (TRL's signature, rlkit.envs.reward_fn); when set it
    # is the environment and env.name is not read. Imported in the driver, from the working directory or PYTHONPATH
    reward_fn: Optional[str] = Field(None, pattern=r"^[A-Za-z_][\w.]*:[A-Za-z_][\w.]*$")
    math_timeout_s: float = Field(5.0, gt=0)
    # a weighted list of rewards, [{fn: my_module:my_reward, weight: 0.8}, {env: arithmetic, weight: 0.2}]: when
    # set, the environment is their weighted sum (rlkit.envs.judge.WeightedRewards; env.name and env.reward_fn are
    # not read), each component logged as rollout/reward/<name>_mean. A judge needs an engine: build it in Python
    rewards: list[RewardComponentConfig] = Field(default_factory=list)
    # score() raises RewardError when more than this share of a batch's samples fail (all failing always does)
    max_reward_failure_fraction: float = Field(MAX_REWARD_FAILURE_FRACTION, ge=0, le=1)
    # which part of a completion is its answer: "completion", the environment's own rule (arithmetic: the whole
    # completion stripped); "last_number", the last number it writes ("27 + 82 = 109" -> 109; "1,200" -> 1200), what
    # a chat model answers. env.name=arithmetic and reasoning_gym (inside the <answer> tag when asked for and present)
    answer_from: AnswerFrom = "completion"

    @field_validator("answer_from")
    @classmethod
    def _answer_from_supported(cls, value: str, info: ValidationInfo) -> str:
        if value == "completion":
            return value
        if info.data.get("rewards") or info.data.get("reward_fn") is not None:
            key = "env.rewards" if info.data.get("rewards") else "env.reward_fn"
            raise PydanticCustomError("answer_from", f"{value!r} is read by env.name's environment, which {key} "
                                      "replaces (its rewards read the completion themselves); extract the answer in "
                                      f"your reward function (rlkit.envs.answers.last_number), or unset {key}")
        name = info.data.get("name")
        if name is not None and name not in ANSWER_FROM_ENVS:
            raise PydanticCustomError("answer_from", f"{value!r} is supported by env.name="
                                      f"{' or '.join(ANSWER_FROM_ENVS)} only, not env.name={name!r}; set "
                                      "env.answer_from=completion, or use one of those environments")
        return value


class SFTConfig(Section):
    """Supervised warm start on the task's reference answers (a random tiny model earns no reward)."""

    enabled: bool = True
    num_steps: int = Field(600, ge=0)
    batch_size: int = Field(64, ge=1)
    lr: float = Field(1e-3, gt=0)
    warmup_steps: int = Field(50, ge=0)
    response_key: str = "answer"


class DPOConfig(Section):
    """Direct preference optimisation from pairs (``Session.dpo``; rlkit.stages.dpo): the reference is the policy
    as DPO starts; its own optimizer, as SFT's."""

    num_steps: int = Field(100, ge=0)
    batch_size: int = Field(16, ge=1)  # pairs per step (2x rows)
    lr: float = Field(5e-5, gt=0)
    warmup_steps: int = Field(0, ge=0)
    beta: float = Field(0.1, gt=0)
    loss_type: Literal["sigmoid", "robust", "ipo"] = "sigmoid"  # DPO, robust DPO, or IPO (mean token logprobs), as TRL
    label_smoothing: float = Field(0.0, ge=0, lt=0.5)  # robust only: the fraction of pairs assumed flipped
    # plus this times the chosen responses' token-mean NLL (TRL's "sft" loss type beside the pair loss; RPO)
    sft_weight: float = Field(0.0, ge=0)
    # JSONL/JSON/parquet of prompt, chosen, rejected; unset: pairs from the task's integer answers (a near miss
    # rejected: rlkit.data.preference.pairs_from_answers)
    train_file: Optional[str] = None

    @model_validator(mode="after")
    def _smoothing_for_robust(self) -> "DPOConfig":
        if self.label_smoothing and self.loss_type != "robust":
            raise ValueError(f"label_smoothing={self.label_smoothing} is read by loss_type 'robust' only (as TRL's); "
                             f"set dpo.loss_type=robust or dpo.label_smoothing=0")
        return self


# where a value model (PPO's critic, a reward model in training) runs (rlkit.policy.value_model builds each), and
# whether that is the policy's training backend in its layout (Megatron: tensor and sequence parallel): transformers'
# model in this process, or the policy's backend
VALUE_BACKEND_ON_POLICY: dict[str, bool] = {"transformers": False, "policy": True}
ValueBackendName = Literal[tuple(VALUE_BACKEND_ON_POLICY)]  # type: ignore[valid-type]


class CriticConfig(Section):
    """PPO's learned value model (rlkit.policy.critic), for ``grpo.advantage_estimator: gae``: the decoder of
    ``model_name`` (default: the policy's folder) with a new one-output head per token, its own AdamW, trained on
    the GAE returns with the clipped value loss after each policy update, on ``backend``."""

    enabled: bool = False
    model_name: Optional[str] = None  # a causal-LM folder; null: policy.model_name
    backend: ValueBackendName = "transformers"  # policy: the policy's backend and layout (megatron, dtensor, hf)
    lr: float = Field(1e-5, gt=0)
    value_clip: float = Field(0.5, gt=0)  # verl's cliprange_value
    micro_batch_size: int = Field(16, ge=1)
    max_grad_norm: Optional[float] = Field(1.0, gt=0)

    @property
    def on_policy_backend(self) -> bool:
        """Whether the value model runs on the policy's training backend, in its layout."""
        return VALUE_BACKEND_ON_POLICY[self.backend]


class DistillationConfig(Section):
    """On-policy distillation (rlkit.algorithms.distillation): a frozen teacher, loaded once on the policy's backend,
    scores every token the student sampled; ``-kl_coef`` x the per-token reverse KL is the token's advantage, plus
    ``reward_weight`` x the environment's (``grpo.advantage_estimator``'s)."""

    enabled: bool = False
    teacher_model_name: Optional[str] = None  # an HF folder with the student's tokenizer (checked before loading)
    kl_coef: float = Field(_DISTILL.kl_coef, gt=0)
    kl_estimator: KLEstimatorName = _DISTILL.kl_estimator  # k1: log p - log q (tinker-cookbook's); k3: >= 0
    discount: float = Field(_DISTILL.discount, ge=0, le=1)  # 0: each token's own KL; else summed over later tokens
    reward_weight: float = Field(_DISTILL.reward_weight, ge=0)  # 0: the teacher alone

    @model_validator(mode="after")
    def _teacher_named(self) -> "DistillationConfig":
        if self.enabled and not self.teacher_model_name:
            raise ValueError("distillation.enabled needs distillation.teacher_model_name: the folder of the teacher "
                             "(an HF causal-LM folder with the student's tokenizer)")
        return self

    def params(self) -> DistillationParams:
        """The settings the teacher's advantages read, as their own dataclass."""
        return DistillationParams(self.kl_coef, self.kl_estimator, self.discount, self.reward_weight)


class RewardModelConfig(Section):
    """Training a reward model on preference pairs (``Session.train_reward_model``; rlkit.stages.reward_model):
    Bradley-Terry, AdamW, one batch of pairs a step, on ``backend`` (a value model, rlkit.policy.value_model)."""

    backend: ValueBackendName = "transformers"  # policy: the policy's backend and layout (megatron, dtensor, hf)

    num_steps: int = Field(200, ge=0)
    batch_size: int = Field(16, ge=1)  # pairs per step
    lr: float = Field(1e-4, gt=0)
    max_grad_norm: Optional[float] = Field(1.0, gt=0)
    center_rewards_coefficient: Optional[float] = Field(None, ge=0)  # TRL's: + coef * mean((s_c + s_r)^2)
    max_length: Optional[int] = Field(None, ge=1)  # tokens per text, cut from the left; null: whole texts

    @property
    def on_policy_backend(self) -> bool:
        """Whether the value model runs on the policy's training backend, in its layout."""
        return VALUE_BACKEND_ON_POLICY[self.backend]


class EvalConfig(Section):
    num_prompts: int = Field(500, ge=1)  # held-out prompts scored by evaluate()
    greedy: bool = True  # false: sampled at policy.generation's temperature, top_p, top_k (its stop strings: always)
    # held-out accuracy falling by more than this below its best while the reward rises: run() flags reward hacking
    # (warnings/reward_hacking, rlkit.run.reward_hacking); null: never
    reward_hacking_drop: Optional[float] = Field(0.1, gt=0, le=1)


class LoggerConfig(Section):
    log_dir: str = "runs"
    jsonl_enabled: bool = True
    wandb_enabled: bool = False
    wandb_project: str = "rlkit"
    wandb_mode: Literal["offline", "online", "disabled"] = "offline"
    wandb_group: Optional[str] = None
    sample_table_period: int = Field(10, ge=0)  # steps between logged sample tables; 0 disables
    sample_table_rows: Optional[int] = Field(8, ge=1)  # samples in each logged table; null: the step's whole batch


class CheckpointConfig(Section):
    enabled: bool = False
    save_period: int = Field(50, ge=1)
    keep_last: int = Field(2, ge=1)
    checkpoint_dir: Optional[str] = None  # default: <log_dir>/<name>/checkpoints


class HistoryConfig(Section):
    """What a run keeps of its past steps for the what-if instruments (:mod:`rlkit.run.history`): each step's batch
    in a bounded in-memory ring (``session.history[k].batch``), on disk as parquet in the run folder while the
    session records, and a ring of policy states that makes ``session.replay(step)`` exact. Every part is bounded:
    the oldest goes first."""

    max_steps: int = Field(64, ge=0)  # batches kept in memory (0: none)
    max_bytes: int = Field(256 * 2**20, ge=0)  # ... and at most this many bytes of them
    disk_max_rows: int = Field(1_000_000, ge=0)  # sample rows kept in <run folder>/rollouts (0: none written)
    disk_max_bytes: int = Field(2 * 2**30, ge=0)  # ... and at most this many bytes of parquet
    snapshots: int = Field(4, ge=0)  # policy states kept (the weights each of the last N steps started from)
    # with adapters off, a snapshot is every trainable weight: kept only when this is on (the memory plan's cost
    # per snapshot is the trainable parameters in fp32); with adapters on, a snapshot is the adapters, always kept
    full_weight_snapshots: bool = False


class RunConfig(Section):
    """A whole run: one section per component (``config.policy.optimizer.lr``); YAML keys are the same dotted."""

    name: str = "run"
    seed: int = 0
    policy: PolicyConfig = PolicyConfig()
    grpo: GRPOConfig = GRPOConfig()
    loss_fn: LossParams = LossParams()
    env: EnvConfig = EnvConfig()
    data: DataParams = DataParams(task="arithmetic")
    sft: SFTConfig = SFTConfig()
    dpo: DPOConfig = DPOConfig()
    reward_model: RewardModelConfig = RewardModelConfig()
    critic: CriticConfig = CriticConfig()
    distillation: DistillationConfig = DistillationConfig()
    eval: EvalConfig = EvalConfig()
    logger: LoggerConfig = LoggerConfig()
    checkpointing: CheckpointConfig = CheckpointConfig()
    history: HistoryConfig = HistoryConfig()

    @property
    def generation_colocated(self) -> bool:
        """Whether the engine runs in this process (the one reading of ``policy.generation.colocated.enabled``)."""
        return generation_colocated(self.policy.generation, self.grpo.async_grpo.enabled)

    @property
    def updates_per_step(self) -> int:
        """Optimizer steps (policy versions) one RL step takes: epochs x minibatches."""
        samples = self.grpo.num_prompts_per_step * self.grpo.num_generations_per_prompt
        return self.grpo.num_epochs * max(1, samples // (self.policy.train_global_batch_size or samples))
