"""Per-token estimators of KL(pi || pi_ref) from sampled-token logprobs (Schulman 2020, "Approximating
KL Divergence", http://joschu.net/blog/kl-approx.html).

With samples from pi and ``log_ratio = log pi_ref(x) - log pi(x)`` (``[B, T]``):

    k1 = -log_ratio                       unbiased, high variance, can be negative
    k2 = 0.5 * log_ratio^2                biased, low variance, >= 0
    k3 = exp(log_ratio) - 1 - log_ratio   unbiased, low variance, >= 0 (the GRPO default)

Each estimator is a function of ``log_ratio`` alone, registered in ``KL_ESTIMATORS``. k3 always clamps its
input to ``[-20, 20]`` (as verl's k3 does): ``exp`` overflows in fp32 past ~89, and an inf KL gives an inf
loss and NaN gradients. ``kl_penalty``
optionally clamps ``log_ratio`` to ``[-kl_clamp, kl_clamp]`` before the estimator (so ``exp`` cannot
overflow) and the result to the same range after it. NeMo-RL has two knobs for this
(``kl_input_clamp_value``, ``kl_output_clamp_value``); rlkit keeps one.
"""

from __future__ import annotations

from typing import Callable, Optional

import torch
from torch import Tensor

from rlkit.algorithms.losses import LOG_RATIO_CLAMP
from rlkit.algorithms.params import KL_ESTIMATOR_NAMES, KLEstimatorName
from rlkit.algorithms.registry import Registry

KLEstimatorFn = Callable[[Tensor], Tensor]  # log_ratio [B, T] -> kl [B, T]

KL_ESTIMATORS: Registry[KLEstimatorFn] = Registry(KL_ESTIMATOR_NAMES)


@KL_ESTIMATORS.register("k1")
def k1(log_ratio: Tensor) -> Tensor:
    """``k1 = log pi - log pi_ref = -log_ratio``."""
    return -log_ratio


@KL_ESTIMATORS.register("k2")
def k2(log_ratio: Tensor) -> Tensor:
    """``k2 = 0.5 * (log pi_ref - log pi)^2``."""
    return 0.5 * log_ratio.square()


@KL_ESTIMATORS.register("k3")
def k3(log_ratio: Tensor) -> Tensor:
    """``k3 = pi_ref / pi - 1 - log(pi_ref / pi)``, with ``log_ratio`` clamped to ``[-20, 20]`` (module docstring)."""
    log_ratio = log_ratio.clamp(-LOG_RATIO_CLAMP, LOG_RATIO_CLAMP)
    return torch.exp(log_ratio) - 1 - log_ratio


def kl_penalty(
    logprobs: Tensor,  # [B, T] policy logprobs of the sampled tokens (may require grad)
    ref_logprobs: Tensor,  # [B, T] reference-policy logprobs of the same tokens
    estimator: KLEstimatorName | KLEstimatorFn = "k3",
    kl_clamp: Optional[float] = None,
) -> Tensor:  # [B, T]
    """Per-token KL estimate; gradients flow through ``logprobs``. Padding is not masked here."""
    log_ratio = ref_logprobs - logprobs
    if kl_clamp is not None:
        log_ratio = log_ratio.clamp(-kl_clamp, kl_clamp)
    kl = KL_ESTIMATORS.get(estimator)(log_ratio)
    if kl_clamp is not None:
        kl = kl.clamp(-kl_clamp, kl_clamp)
    return kl
