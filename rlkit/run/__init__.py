"""One run's moving parts above the stages: its mutable state (:mod:`rlkit.run.state`), where each step's batch
comes from (:mod:`rlkit.run.sources`) and the step and run loops (:mod:`rlkit.run.loop`)."""
