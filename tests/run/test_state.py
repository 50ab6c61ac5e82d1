"""RunState: the step's prompt rows are drawn once and extended, never re-drawn; the whole state survives
JSON (a checkpoint's state.json) and a fresh state is what Session(config) starts with."""

import json

from rlkit.algorithms import RunningBaseline
from rlkit.config.loading import load_config
from rlkit.data import PromptSampler
from rlkit.run.metrics import StepMetrics
from rlkit.run.state import RunState

ROWS = [{"prompt": f"p{i}", "answer": str(i)} for i in range(10)]


def test_rows_for_step_draws_once_and_only_the_missing_rows():
    run = RunState(PromptSampler(ROWS, batch_size=3, seed=0))
    order = PromptSampler(ROWS, batch_size=3, seed=0).next_batch(10)  # the order the sampler follows
    first = run.rows_for_step(3)
    assert first == order[:3] and run.rows_for_step(3) == first and run.sampler.position == 3
    assert run.rows_for_step(2) == order[:2] and run.sampler.position == 3  # fewer: the first ones, none drawn
    assert run.rows_for_step(6) == order[:6] and run.sampler.position == 6  # more: only the 3 missing drawn
    run.end_step(StepMetrics(1, 1, {"rollout/reward_mean": 0.5}))
    assert run.step == 1 and run.step_rows == [] and len(run.history) == 1
    assert run.rows_for_step(3) == order[6:9]


def test_state_dict_round_trips_through_json():
    run = RunState(PromptSampler(ROWS, batch_size=4, seed=7), baseline=RunningBaseline(0.25, 3))
    run.rows_for_step(4)
    run.end_step(StepMetrics(1, 2, {"rollout/reward_mean": 0.5}))
    run.rows_for_step(4)
    run.batch, run.last_train, run.stop_requested = object(), object(), True
    saved = json.loads(json.dumps(run.state_dict()))

    other = RunState(PromptSampler(ROWS, batch_size=4, seed=0))
    other.load_state_dict(saved)
    assert other.state_dict() == run.state_dict()
    assert other.step == 1 and other.baseline == RunningBaseline(0.25, 3) and other.step_rows == run.step_rows
    assert other.history[0].policy_version == 2 and other.history[0]["rollout/reward_mean"] == 0.5
    assert other.batch is None and other.last_train is None and not other.stop_requested
    assert other.sampler.next_batch(3) == run.sampler.next_batch(3)  # the same prompts follow


def test_fresh_is_step_zero_at_the_start_of_the_seeds_order():
    config = load_config("quickstart", ["seed=4", "grpo.num_prompts_per_step=5"])
    run = RunState.fresh(config, {"train": ROWS})
    assert (run.step, run.history, run.step_rows, run.batch) == (0, [], [], None)
    assert run.sampler.seed == 4 and run.sampler.batch_size == 5 and run.sampler.position == 0
    assert run.baseline == RunningBaseline()

