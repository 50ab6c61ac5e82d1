"""One run's moving parts above the stages: the :class:`~rlkit.run.run.Run` that calls the stage functions
(:mod:`rlkit.run.run`), its mutable state (:mod:`rlkit.run.state`), where each step's batch comes from
(:mod:`rlkit.run.sources`; async GRPO's producer in :mod:`rlkit.run.async_rollouts`), the step machinery: the
step's metrics record (:mod:`rlkit.run.metrics`), the step clock (:mod:`rlkit.run.step_clock`), skipped steps
(:mod:`rlkit.run.skipped_steps`), the batch-reuse warning (:mod:`rlkit.run.reuse`) the loop over steps
(:mod:`rlkit.run.steps`) and its bar (:mod:`rlkit.run.loop`); and the what-if instruments over them: the rollout history of past batches and weights
(:mod:`rlkit.run.history`), replay of a past step (:mod:`rlkit.run.replay`) and in-memory branches
(:mod:`rlkit.run.fork`)."""
