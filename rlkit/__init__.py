"""rlkit: step through RL post-training of language models, one stage per notebook cell."""

from rlkit.config.loading import load_config
from rlkit.errors import ConfigError, ModelError, StageOrderError

__version__ = "0.1.0"


def __getattr__(name):  # the Session pulls in Megatron and vLLM, open_run pandas, Trajectories torch: import them
    if name == "Session":  # only when asked for, so that `import rlkit` and load_config import none of them
        from rlkit.session import Session

        return Session
    if name == "open_run":
        from rlkit.tracking.runs import open_run

        return open_run
    if name == "Trajectories":
        from rlkit.trajectories import Trajectories

        return Trajectories
    raise AttributeError(name)


__all__ = ["ConfigError", "ModelError", "Session", "StageOrderError", "Trajectories", "load_config", "open_run"]
