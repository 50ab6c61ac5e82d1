"""What the run config names and sets in the algorithm layer, apart from the functions: each registry's name table
with its ``Literal``, and the knobs of each area (``AdvantageParams``, ``PolicyLossParams``, ``CorrectionParams``,
``LossParams``, ``DistillationParams``).

Why apart: the functions are tensor code and import torch; loading and validating a config needs only the names
and the knobs, so it imports this module and no torch (tests/config/test_no_torch_at_load.py). Each area's module
builds its registry over the table here, and the registry refuses to register a name the table lacks
(:class:`~rlkit.algorithms.registry.Registry`); tests/algorithms/test_name_tables.py holds every table equal to its
registry's entries. A new variant is its function in its area's module plus its name here.
"""

from __future__ import annotations

from dataclasses import dataclass, fields
from typing import Callable, Literal, Optional, Union

from rlkit.algorithms.registry import VariantNames
from rlkit.errors import ConfigError

ADVANTAGE_ESTIMATOR_NAMES = VariantNames(
    "advantage estimator", ("grpo", "dr_grpo", "rloo", "gae", "reinforce_pp", "reinforce_baseline"))
POLICY_LOSS_NAMES = VariantNames("policy loss", ("ppo_clip", "gspo", "cispo", "reinforce"))
KL_ESTIMATOR_NAMES = VariantNames("KL estimator", ("k1", "k2", "k3"))
CORRECTION_NAMES = VariantNames("off-policy correction", ("none", "tis", "seq_mask"))
AGGREGATION_NAMES = VariantNames("loss aggregation", ("token_mean", "seq_mean_token_mean", "seq_sum_constant"))

AdvantageEstimatorName = Literal[ADVANTAGE_ESTIMATOR_NAMES.names]  # type: ignore[valid-type]
PolicyLossName = Literal[POLICY_LOSS_NAMES.names]  # type: ignore[valid-type]
KLEstimatorName = Literal[KL_ESTIMATOR_NAMES.names]  # type: ignore[valid-type]
CorrectionName = Literal[CORRECTION_NAMES.names]  # type: ignore[valid-type]
AggregationName = Literal[AGGREGATION_NAMES.names]  # type: ignore[valid-type]


@dataclass(frozen=True)
class AdvantageParams:
    """Knobs of the advantage estimators (NeMo-RL names where NeMo-RL has them)."""

    normalize_rewards: bool = True  # grpo: divide by the group std; reinforce_pp: by the batch std
    use_leave_one_out_baseline: bool = False  # grpo: baseline = mean of the other G-1 samples (RLOO)
    epsilon: float = 1e-6  # added to the std before dividing
    kl_coef: float = 0.0  # reinforce_pp: KL folded into the per-token reward, r_t -= kl_coef * kl_t
    gamma: float = 1.0  # reinforce_pp, gae: discount of the per-token return
    gae_lambda: float = 1.0  # gae: lambda of generalized advantage estimation (verl's default 1.0)
    baseline_momentum: float = 0.9  # reinforce_baseline: EMA momentum of the running baseline

    @property
    def kl_in_reward(self) -> bool:
        """True when the estimator needs per-token KL (so the caller must compute reference logprobs)."""
        return self.kl_coef != 0.0


@dataclass(frozen=True)
class PolicyLossParams:
    """Clip knobs, NeMo-RL names. GSPO wants much smaller bounds (the paper uses 3e-4 / 4e-4)."""

    ratio_clip_min: float = 0.2  # eps_lo: lower bound 1 - eps_lo
    ratio_clip_max: float = 0.2  # eps_hi: upper bound 1 + eps_hi (DAPO clip-higher: 0.28)
    ratio_clip_c: Optional[float] = None  # dual clip c > 1 for negative advantages (usually 3); None = off
    # CISPO IS-weight cap 1 + cispo_clip_max, no lower bound (NeMo-RL expresses the same with
    # ratio_clip_min=1.0, ratio_clip_max=5.0 under use_cispo).
    cispo_clip_max: float = 5.0


@dataclass(frozen=True)
class CorrectionParams:
    tis_cap: float = 2.0  # tis: upper bound C of the token IS weight
    # seq_mask: keep sequences with low <= rho_seq <= high. rho_seq is a per-token geometric mean, which
    # stays within ~1e-3 of 1 when generator and trainer match, hence the tight defaults.
    seq_mask_low: float = 0.999
    seq_mask_high: float = 1.001


_P, _C = PolicyLossParams, CorrectionParams  # defaults live on those classes; LossParams reuses them


@dataclass(frozen=True)
class LossParams:
    """Everything ``RLLoss`` needs, flat, with NeMo-RL names where NeMo-RL has the knob."""

    __pydantic_config__ = {"extra": "forbid"}  # as a section of the run config: unknown keys are errors

    # or a callable with the signature of rlkit.algorithms.losses.PolicyLossFn
    policy_loss: Union[PolicyLossName, Callable] = "ppo_clip"
    ratio_clip_min: float = _P.ratio_clip_min
    ratio_clip_max: float = _P.ratio_clip_max
    ratio_clip_c: Optional[float] = _P.ratio_clip_c
    cispo_clip_max: float = _P.cispo_clip_max
    aggregation: AggregationName = "token_mean"
    seq_sum_constant: Optional[float] = None  # seq_sum_constant aggregation: max generation length
    reference_policy_kl_penalty: float = 0.0  # beta of the KL-to-reference loss term
    kl_estimator: KLEstimatorName = "k3"  # NeMo-RL: reference_policy_kl_type
    kl_clamp: Optional[float] = None  # clamps log-ratio and KL to [-kl_clamp, kl_clamp]
    off_policy_correction: CorrectionName = "none"
    tis_cap: float = _C.tis_cap
    seq_mask_low: float = _C.seq_mask_low
    seq_mask_high: float = _C.seq_mask_high

    def __post_init__(self) -> None:
        problems = self.problems()
        if problems:
            raise ConfigError(problems)

    def problems(self) -> list[str]:
        """Every invalid setting, each as ``key: reason; fix`` (empty when the params are usable)."""
        out = [
            f"{key}: {table.unknown_message(getattr(self, key))}"
            for key, table in (
                ("policy_loss", POLICY_LOSS_NAMES),
                ("aggregation", AGGREGATION_NAMES),
                ("kl_estimator", KL_ESTIMATOR_NAMES),
                ("off_policy_correction", CORRECTION_NAMES),
            )
            if not (callable(getattr(self, key)) or getattr(self, key) in table)
        ]
        checks = [
            (self.ratio_clip_min < 0 or self.ratio_clip_min > 1, "ratio_clip_min", "must be in [0, 1]; 0.2 is usual"),
            (self.ratio_clip_max < 0, "ratio_clip_max", "must be >= 0; 0.2 (0.28 for DAPO clip-higher)"),
            (self.ratio_clip_c is not None and self.ratio_clip_c <= 1, "ratio_clip_c", "must be > 1 (3 is usual) or None"),
            (self.cispo_clip_max < 0, "cispo_clip_max", "must be >= 0"),
            (
                self.aggregation == "seq_sum_constant" and not (self.seq_sum_constant or 0) > 0,
                "seq_sum_constant",
                "aggregation 'seq_sum_constant' needs a positive constant: set it to the max generation length",
            ),
            (self.reference_policy_kl_penalty < 0, "reference_policy_kl_penalty", "must be >= 0 (0 disables KL)"),
            (self.kl_clamp is not None and self.kl_clamp <= 0, "kl_clamp", "must be > 0 or None"),
            (self.tis_cap <= 0, "tis_cap", "must be > 0; 2.0 is usual"),
            (
                not 0 <= self.seq_mask_low <= self.seq_mask_high,
                "seq_mask_low",
                f"need 0 <= seq_mask_low <= seq_mask_high (seq_mask_high={self.seq_mask_high})",
            ),
        ]
        return out + [f"{key}={getattr(self, key)!r}: {fix}" for bad, key, fix in checks if bad]

    def policy_params(self) -> PolicyLossParams:
        """The settings the policy-loss functions read (clip ranges), as their own dataclass."""
        return PolicyLossParams(**{f.name: getattr(self, f.name) for f in fields(PolicyLossParams)})

    def correction_params(self) -> CorrectionParams:
        """The settings the off-policy corrections read (TIS cap, sequence-mask bounds)."""
        return CorrectionParams(**{f.name: getattr(self, f.name) for f in fields(CorrectionParams)})


@dataclass(frozen=True)
class DistillationParams:
    """How the teacher's logprobs become advantages (``distillation.*`` in the run config)."""

    kl_coef: float = 1.0
    kl_estimator: KLEstimatorName = "k1"
    discount: float = 0.0  # 0: each token's own KL; > 0: the discounted sum of the KL of it and the later tokens
    reward_weight: float = 0.0  # times the environment's advantage, added to the teacher's
