"""Every second of a step is accounted for: the ``timing/`` parts of a step's record add up to its
``timing/step_total`` (within 5%), and the unnamed rest, ``timing/other``, is under 5% of it, for ``step()``,
``run()`` and ``run_experiment`` (what ``rlkit train`` calls), with and without dynamic sampling."""

import json
import time

import pytest

import rlkit
from rlkit.notebook.display import SAMPLE_COLUMNS
from rlkit.run.step_clock import PARTS, accounted
from tests.session.conftest import tiny_overrides, varied_reward


def assert_accounted(values, *required):
    total = values["timing/step_total"]
    assert accounted(values) == pytest.approx(total, rel=0.05)
    assert 0 <= values["timing/other"] < 0.05 * total, {k: v for k, v in values.items() if k.startswith("timing/")}
    for part in required:
        assert values[f"timing/{part}"] > 0, part


@pytest.fixture(scope="module", params=[False, True], ids=["plain", "dynamic_sampling"])
def timed_session(request, tmp_path_factory):
    from rlkit.envs import RewardFunctionEnvironment

    overrides = tiny_overrides(tmp_path_factory.mktemp("timing"), **{
        "grpo.use_dynamic_sampling": request.param, "grpo.dynamic_sampling_max_gen_batches": 3,
        "grpo.val_period": 2, "eval.num_prompts": 4})
    s = rlkit.Session.from_config("quickstart", overrides, env=RewardFunctionEnvironment(varied_reward))
    s.step()  # warm-up: first calls pay one-off costs
    yield s
    s.close()


def test_step_parts_add_up_to_its_total(timed_session):
    m = timed_session.step()
    # (logprobs is 0 s: the train step computes them, tests/session/test_step_logprobs.py)
    assert_accounted(m.values, "rollout", "score", "advantages", "train", "metrics", "refit")


@pytest.mark.filterwarnings("ignore:100% of prompt groups")
def test_dynamic_sampling_rounds_are_all_timed(timed_session, monkeypatch):
    if not timed_session.config.grpo.use_dynamic_sampling:
        pytest.skip("plain rollouts have one round")
    generator, generate = timed_session.generator, timed_session.generator.generate

    def slow_generate(*args, **kwargs):  # each round's generation and scoring 50 ms longer
        time.sleep(0.05)
        return generate(*args, **kwargs)

    def same_reward(prompts, completions, answer, **_):
        time.sleep(0.05)
        return [1.0] * len(completions)

    monkeypatch.setattr(generator, "generate", slow_generate)
    timed_session.env.fn = same_reward
    try:  # every group has zero variance: all 3 rounds run, and their generation must be in timing/rollout
        m = timed_session.step()
    finally:
        timed_session.env.fn = varied_reward
    assert timed_session.batch.info["dynamic_sampling/tries"] == 3
    assert m["dynamic_sampling/tries"] == 3 and m["dynamic_sampling/kept_groups"] == 0  # in the step's record too
    assert_accounted(m.values, "rollout", "score")
    assert m["timing/rollout"] >= 3 * 0.05 and m["timing/score"] >= 3 * 0.05  # every round's, once


def test_stages_run_cell_by_cell_are_timed_once_in_the_record_train_makes(timed_session):
    s = timed_session
    s.advantages(s.logprobs(s.score(s.rollout())))
    m = s.train()
    for part in ("rollout", "score", "logprobs", "advantages", "train"):
        assert m[f"timing/{part}"] > 0, part
    assert m["timing/reference_logprobs"] >= 0 and "timing/step_total" not in m.values
    assert not [k for k in s.batch.info if k.startswith("timing/")]  # the stage functions write no timer of theirs
    assert "timing/rollout" not in s.train(s.batch, allow_reuse=True).values  # counted in the record before


def test_run_parts_add_up_including_progress_eval_and_listeners(timed_session):
    slow = []
    history = timed_session.run(4, progress=True, on_step=lambda m: slow.append(sum(range(200_000))))
    for m in history:
        assert_accounted(m.values, "rollout", "train", "progress")
    assert [("timing/eval" in m.values) for m in history] == [m.step % 2 == 0 for m in history]  # val_period=2
    assert all(m["timing/listeners"] > 0 for m in history[1:])  # the previous step's listeners, and the last's own


def test_a_slow_progress_bar_close_is_timed_as_progress(timed_session, monkeypatch):
    import time

    import tqdm.std

    close = tqdm.std.tqdm.close

    def slow_close(bar):  # closing joins tqdm's monitor thread: under load it has taken milliseconds
        time.sleep(0.05)
        close(bar)

    monkeypatch.setattr(tqdm.std.tqdm, "close", slow_close)
    last = timed_session.run(1, progress=True)[-1]
    assert_accounted(last.values, "progress")
    assert last["timing/progress"] >= 0.05


def test_experiment_records_account_for_logging_tables_and_checkpoints(tmp_path):
    from rlkit.config.loading import load_config
    from rlkit.experiment import run_experiment

    config = load_config("quickstart", tiny_overrides(tmp_path, **{
        "grpo.max_num_steps": 4, "logger.sample_table_period": 1, "checkpointing.enabled": True,
        "checkpointing.save_period": 2, "checkpointing.checkpoint_dir": str(tmp_path / "ckpt"),
        "eval.num_prompts": 4, "name": "timing", "logger.wandb_enabled": True, "logger.wandb_mode": "offline"}))
    run_experiment(config, progress=False)
    records = [json.loads(line) for line in (tmp_path / "runs" / "timing" / "metrics.jsonl").read_text().splitlines()]
    steps = [r for r in records if "timing/step_total" in r]
    assert len(steps) == 4
    for r in steps[1:]:  # the first step's record has no earlier step's logging
        assert_accounted(r, "rollout", "train", "logging", "tables")
    assert "timing/checkpoint" in steps[2] and "timing/checkpoint" not in steps[1]  # step 2 saved, step 3 counts it
    assert set(k.removeprefix("timing/") for r in steps for k in r if k.startswith("timing/")) - set(PARTS) <= {
        "step_total", "samples_per_second", "tokens_per_second"}
    tables = [json.loads(line) for line in (tmp_path / "runs" / "timing" / "tables.jsonl").read_text().splitlines()]
    assert [(t["step"], t["name"], t["columns"]) for t in tables] == [(s, "rollout/samples", list(SAMPLE_COLUMNS))
                                                                       for s in (1, 2, 3, 4)]
    assert all([row[:2] for row in t["rows"]] == [[i, i // 4] for i in range(8)] for t in tables)  # 8 samples, G=4
