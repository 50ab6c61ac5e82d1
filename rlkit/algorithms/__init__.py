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
    params       each registry's names and each area's knobs, torch-free: what the run config imports

Only ``params`` and ``registry`` load with the package; a name of the modules above loads its module, and torch, the
first time it is asked for (``from rlkit.algorithms import RLLoss``), so that loading a config imports no torch.
"""

from importlib import import_module

from rlkit.algorithms.params import (
    AdvantageEstimatorName,
    AdvantageParams,
    AggregationName,
    CorrectionName,
    CorrectionParams,
    DistillationParams,
    KLEstimatorName,
    LossParams,
    PolicyLossName,
    PolicyLossParams,
)
from rlkit.algorithms.registry import Registry, UnknownVariantError

_MODULE_OF = {  # the names whose modules import torch: loaded on first use (module docstring)
    **dict.fromkeys(("ADVANTAGE_ESTIMATORS", "AdvantageFn", "RunningBaseline", "compute_advantages", "group_stats",
                     "zero_variance_group_fraction"), "advantages"),
    **dict.fromkeys(("AGGREGATIONS", "AggregationFn", "aggregate", "count_valid"), "aggregation"),
    **dict.fromkeys(("CORRECTIONS", "Correction", "CorrectionFn", "token_mult_prob_error"), "correction"),
    **dict.fromkeys(("nonzero_variance_groups", "overlong_reward_shaping"), "dapo"),
    "teacher_advantages": "distillation",
    **dict.fromkeys(("KL_ESTIMATORS", "KLEstimatorFn", "kl_penalty"), "kl"),
    "RLLoss": "loss_fn",
    **dict.fromkeys(("POLICY_LOSS_METRICS", "POLICY_LOSSES", "PolicyLossFn"), "losses"),
}


def __getattr__(name: str):
    if name not in _MODULE_OF:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(import_module(f"{__name__}.{_MODULE_OF[name]}"), name)
    globals()[name] = value  # (asked once)
    return value


def __dir__() -> list[str]:  # (a notebook's tab completion lists the names not loaded yet too)
    return sorted(set(globals()) | set(__all__))


# the names loaded with the package, and the lazy ones of _MODULE_OF
__all__ = sorted(["AdvantageEstimatorName", "AdvantageParams", "AggregationName", "CorrectionName", "CorrectionParams",
                  "DistillationParams", "KLEstimatorName", "LossParams", "PolicyLossName", "PolicyLossParams",
                  "Registry", "UnknownVariantError", *_MODULE_OF])
