"""On-policy distillation's stage: the teacher's logprobs of the tokens the student sampled (before advantages).

``teacher_logprobs`` fills ``batch.teacher_logprobs`` [B, T] (0 outside the completion) from the frozen teacher
(:mod:`rlkit.policy.teacher`), at the student's sampling temperature, and ``info["distillation/teacher_kl"]``:
the mean per-token reverse KL ``log p_student - log q_teacher`` (k1) over the completion tokens, with the
student's logprobs the generator's. The advantages stage turns them into the teacher's advantages
(:func:`rlkit.algorithms.teacher_advantages`); ``batch.show(color="teacher")`` colours each token by it.
"""

from __future__ import annotations

from typing import Any

import torch

from rlkit.algorithms.distillation import reverse_kl
from rlkit.trajectories import Trajectories


def teacher_logprobs(batch: Trajectories, teacher: Any) -> Trajectories:
    """``batch`` with the teacher's ``teacher_logprobs`` [B, T] of its completion tokens and their mean reverse KL."""
    if teacher is None:
        raise ValueError("this session has no distillation teacher: set distillation.enabled=true and "
                         "distillation.teacher_model_name (the `distill_quickstart` preset sets both)")
    mask = batch.loss_mask
    scores = teacher.logprobs(batch.input_ids, batch.attention_mask, scored=mask).logprobs
    teacher_lp = torch.where(mask, scores.to(mask.device), 0.0)
    kl = reverse_kl(batch.generator_logprobs, teacher_lp, mask)
    mean_kl = float(kl.sum() / mask.sum().clamp(min=1))
    return batch.with_(teacher_logprobs=teacher_lp, info=dict(batch.info, **{"distillation/teacher_kl": mean_kl}))
