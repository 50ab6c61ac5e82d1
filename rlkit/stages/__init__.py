"""The stages of an RL step, each a plain function over :class:`rlkit.trajectories.Trajectories`."""
