"""On-policy distillation: a teacher scores every token the student sampled, and the per-token reverse KL
``KL(student || teacher)`` is the signal (tinker-cookbook's ``distillation/train_on_policy.py``, NeMo-RL's
distillation, Agarwal et al. 2024 "On-Policy Distillation of Language Models").

With the student's logprob ``log p`` and the teacher's ``log q`` of each sampled token ([B, T], 0 outside the
completion), a KL estimator (:mod:`rlkit.algorithms.kl`, ``log_ratio = log q - log p``) gives the per-token
reverse KL: ``k1 = log p - log q`` (tinker-cookbook's), ``k3 = q/p - 1 - log(q/p)`` (>= 0, lower variance).
The token's advantage is ``-kl_coef * kl`` (the student is pushed toward tokens the teacher finds likely),
optionally summed over the later tokens of the completion with ``discount`` (tinker-cookbook's
``kl_discount_factor``; 0: each token its own), and added to ``reward_weight`` times the environment's advantage
(0: distillation alone; 1: tinker-cookbook's sum of both).
"""

from __future__ import annotations

from torch import Tensor

from rlkit.algorithms.kl import kl_penalty
from rlkit.algorithms.params import DistillationParams, KLEstimatorName
from rlkit.algorithms.returns import discounted_returns


def reverse_kl(student_logprobs: Tensor, teacher_logprobs: Tensor, mask: Tensor,
               estimator: KLEstimatorName = "k1") -> Tensor:  # [B, T]
    """Per-token estimate of ``KL(student || teacher)`` [B, T] at the student's sampled tokens, 0 outside ``mask``."""
    return kl_penalty(student_logprobs, teacher_logprobs, estimator) * mask


def teacher_advantages(student_logprobs: Tensor, teacher_logprobs: Tensor, mask: Tensor,
                       params: DistillationParams = DistillationParams()) -> Tensor:  # [B, T]
    """The teacher's per-token advantages [B, T]: ``-kl_coef * reverse_kl``, discounted over the later tokens when
    ``params.discount`` > 0; 0 outside ``mask``."""
    adv = -params.kl_coef * reverse_kl(student_logprobs, teacher_logprobs, mask, params.kl_estimator)
    return discounted_returns(adv, mask, params.discount) if params.discount > 0 else adv
