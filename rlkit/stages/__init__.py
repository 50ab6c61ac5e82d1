"""The stages of an RL step, each a plain function over :class:`rlkit.trajectories.Trajectories`.

    rollout -> score -> logprobs -> (values, teacher_logprobs) -> advantages -> train (or loss) -> refit;
    evaluate, sft, dpo aside.

Logprobs come before advantages because estimators that fold KL into the reward need the reference
logprobs. ``Session.step()`` skips the logprobs pass when a batch's one update computes the same values in its
own forward (``logprobs_from_train_step``, :meth:`rlkit.Session.step`). What each stage reads from the config is
one settings object (:mod:`rlkit.stages.settings`). Where ``Session.rollout()`` gets a step's batch is a rollout
source (plain, dynamic sampling, or async GRPO's producer): :mod:`rlkit.run.sources`.

Only stages live here, and what a stage needs. Kept, each for its reason: the settings each stage reads
(:mod:`rlkit.stages.settings`); :mod:`rlkit.stages.batching`, the rollout stage's own step from generator output
to a padded batch (``rollout.py`` imports it); :mod:`rlkit.stages.dynamic_sampling`, a plain function over
scored batches (``stages.dynamic_sampling``; the rollout source calls it each step); :mod:`rlkit.stages.compare`,
losses compared per token on one batch, a stage beside the step like ``evaluate``. Moved to :mod:`rlkit.run`, the
step machinery the Run drives: the step clock, skipped steps, the batch-reuse warning, async GRPO's producer and
the step's metrics record (``StepMetrics``, ``step_metrics``). They could move up because nothing in stages/,
tracking/ or below imports them (the run records and the notebook's views read a ``StepMetrics`` they are
given, by its fields); the import contract keeps it so.
"""

from rlkit.stages.advantages import advantages
from rlkit.stages.dpo import DPOResult, dpo
from rlkit.stages.conversations import conversations, is_multi_turn
from rlkit.stages.dynamic_sampling import dynamic_sampling
from rlkit.stages.evaluate import EvalResult, evaluate
from rlkit.stages.logprobs import logprobs, logprobs_from_train_step
from rlkit.stages.refit import refit
from rlkit.stages.reward_model import RewardModelResult, train_reward_model
from rlkit.stages.rollout import rollout
from rlkit.stages.score import score
from rlkit.stages.settings import (DPOSettings, EvalSettings, RolloutSettings, ScoreSettings, SFTSettings,
                                   StageSettings, TrainSettings)
from rlkit.stages.sft import SFTResult, WarmStart, sft
from rlkit.stages.teacher import teacher_logprobs
from rlkit.stages.values import update_critic, values
from rlkit.stages.train import LossReport, TrainInterrupted, TrainResult, loss, loss_description, one_update, train

__all__ = ["DPOResult", "DPOSettings", "EvalResult", "EvalSettings", "LossReport", "RewardModelResult",
           "RolloutSettings", "SFTResult", "SFTSettings", "ScoreSettings", "StageSettings", "TrainInterrupted",
           "TrainResult", "TrainSettings", "WarmStart", "advantages", "conversations", "dpo", "dynamic_sampling",
           "evaluate", "is_multi_turn", "logprobs", "logprobs_from_train_step", "loss", "loss_description",
           "one_update", "refit", "rollout", "score", "sft", "teacher_logprobs", "train", "train_reward_model",
           "update_critic", "values"]
