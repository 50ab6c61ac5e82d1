"""The algorithm layer: small pure functions over tensors, selected by name from registries.

No backend imports and no ``torch.distributed`` here: everything takes ``[B, T]`` tensors (right-padded,
``B = N * G`` with each prompt's samples contiguous, see ``rlkit.trajectories``) and global ``LossCounts``.

    advantages   ADVANTAGE_ESTIMATORS  grpo, dr_grpo, rloo, reinforce_pp, reinforce_baseline
    losses       POLICY_LOSSES         ppo_clip, gspo, cispo, reinforce
    kl           KL_ESTIMATORS         k1, k2, k3
    correction   CORRECTIONS           none, tis, seq_mask
    aggregation  AGGREGATIONS          token_mean, seq_mean_token_mean, seq_sum_constant
    loss_fn      RLLoss                the train-step loss built from LossParams
    dapo         dynamic-sampling filter and overlong reward shaping
    distillation a teacher's per-token reverse KL as advantages (on-policy distillation)
"""

from rlkit.algorithms.advantages import (
    ADVANTAGE_ESTIMATORS,
    AdvantageEstimatorName,
    AdvantageFn,
    AdvantageParams,
    RunningBaseline,
    compute_advantages,
    group_stats,
    zero_variance_group_fraction,
)
from rlkit.algorithms.aggregation import AGGREGATIONS, AggregationFn, AggregationName, aggregate, count_valid
from rlkit.algorithms.correction import (
    CORRECTIONS,
    Correction,
    CorrectionFn,
    CorrectionName,
    CorrectionParams,
    token_mult_prob_error,
)
from rlkit.algorithms.dapo import nonzero_variance_groups, overlong_reward_shaping
from rlkit.algorithms.distillation import DistillationParams, teacher_advantages
from rlkit.algorithms.kl import KL_ESTIMATORS, KLEstimatorFn, KLEstimatorName, kl_penalty
from rlkit.algorithms.loss_fn import LossParams, RLLoss
from rlkit.algorithms.losses import POLICY_LOSS_METRICS, POLICY_LOSSES, PolicyLossFn, PolicyLossName, PolicyLossParams
from rlkit.algorithms.registry import Registry, UnknownVariantError

__all__ = [
    "ADVANTAGE_ESTIMATORS",
    "AGGREGATIONS",
    "CORRECTIONS",
    "KL_ESTIMATORS",
    "POLICY_LOSSES",
    "POLICY_LOSS_METRICS",
    "AdvantageEstimatorName",
    "AdvantageFn",
    "AdvantageParams",
    "AggregationFn",
    "AggregationName",
    "Correction",
    "CorrectionFn",
    "CorrectionName",
    "CorrectionParams",
    "DistillationParams",
    "KLEstimatorFn",
    "KLEstimatorName",
    "LossParams",
    "PolicyLossFn",
    "PolicyLossName",
    "PolicyLossParams",
    "RLLoss",
    "Registry",
    "RunningBaseline",
    "UnknownVariantError",
    "aggregate",
    "compute_advantages",
    "count_valid",
    "group_stats",
    "kl_penalty",
    "nonzero_variance_groups",
    "overlong_reward_shaping",
    "teacher_advantages",
    "token_mult_prob_error",
    "zero_variance_group_fraction",
]
