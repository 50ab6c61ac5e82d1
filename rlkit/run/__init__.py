"""One run's moving parts above the stages: its mutable state (:mod:`rlkit.run.state`), where each step's batch
comes from (:mod:`rlkit.run.sources`), the step and run loops (:mod:`rlkit.run.loop`), and the what-if
instruments over them: the rollout history of past batches and weights (:mod:`rlkit.run.history`), replay of a
past step (:mod:`rlkit.run.replay`) and in-memory branches of a session (:mod:`rlkit.run.fork`)."""
