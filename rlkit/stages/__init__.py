"""The stages of an RL step, each a plain function over :class:`rlkit.trajectories.Trajectories`.

    rollout -> score -> logprobs -> advantages -> train (or loss) -> refit;  evaluate, sft aside.

Logprobs come before advantages because estimators that fold KL into the reward need the reference
logprobs. ``Session.step()`` skips the logprobs pass when a batch's one update computes the same values in its
own forward (``logprobs_from_train_step``, :meth:`rlkit.Session.step`). What each stage reads from the config is
one settings object (:mod:`rlkit.stages.settings`). Where ``Session.rollout()`` gets a step's batch is a rollout
source (plain, dynamic sampling, or async GRPO's producer ``AsyncRollouts``): :mod:`rlkit.run.sources`.
"""

from rlkit.stages.advantages import advantages
from rlkit.stages.async_rollouts import AsyncRollouts
from rlkit.stages.conversations import conversations, is_multi_turn
from rlkit.stages.dynamic_sampling import dynamic_sampling
from rlkit.stages.evaluate import EvalResult, evaluate
from rlkit.stages.logprobs import logprobs, logprobs_from_train_step
from rlkit.stages.refit import refit
from rlkit.stages.rollout import rollout
from rlkit.stages.score import score
from rlkit.stages.settings import (EvalSettings, RolloutSettings, ScoreSettings, SFTSettings, StageSettings,
                                   TrainSettings)
from rlkit.stages.sft import SFTResult, sft
from rlkit.stages.train import LossReport, TrainInterrupted, TrainResult, loss, loss_description, one_update, train

__all__ = ["AsyncRollouts", "EvalResult", "EvalSettings", "LossReport", "RolloutSettings", "SFTResult", "SFTSettings",
           "ScoreSettings", "StageSettings", "TrainInterrupted", "TrainResult", "TrainSettings", "advantages",
           "conversations", "dynamic_sampling", "evaluate", "is_multi_turn", "logprobs", "logprobs_from_train_step",
           "loss", "loss_description", "one_update", "refit", "rollout", "score", "sft", "train"]
