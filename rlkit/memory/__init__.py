"""What a run needs in memory, worked out before anything loads (:mod:`rlkit.memory.plan`)."""
