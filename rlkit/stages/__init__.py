"""The stages of an RL step, each a plain function over :class:`rlkit.trajectories.Trajectories`.

    rollout -> score -> advantages -> logprobs -> train (or loss) -> refit;  evaluate, sft aside.
    AsyncRollouts: async GRPO's background producer of rollouts (rollout of later steps during train).
"""

from rlkit.stages.advantages import advantages
from rlkit.stages.async_rollouts import AsyncRollouts
from rlkit.stages.dynamic_sampling import dynamic_sampling
from rlkit.stages.evaluate import EvalResult, evaluate
from rlkit.stages.logprobs import logprobs
from rlkit.stages.refit import refit
from rlkit.stages.rollout import rollout
from rlkit.stages.score import score
from rlkit.stages.sft import SFTResult, sft
from rlkit.stages.train import LossReport, TrainInterrupted, TrainResult, loss, train

__all__ = ["AsyncRollouts", "EvalResult", "LossReport", "SFTResult", "TrainInterrupted", "TrainResult", "advantages", "dynamic_sampling", "evaluate", "logprobs",
           "loss", "refit", "rollout", "score", "sft", "train"]
