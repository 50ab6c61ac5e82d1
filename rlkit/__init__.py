"""rlkit: step through RL post-training of language models, one stage per notebook cell."""

from rlkit.config.loading import load_config
from rlkit.errors import ConfigError, ModelError, StageOrderError
from rlkit.trajectories import Trajectories

__version__ = "0.1.0"


def __getattr__(name):  # the Session pulls in Megatron and vLLM: import it only when asked for
    if name == "Session":
        from rlkit.session import Session

        return Session
    raise AttributeError(name)


__all__ = ["ConfigError", "ModelError", "Session", "StageOrderError", "Trajectories", "load_config"]
