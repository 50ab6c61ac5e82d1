"""Issue 30, items 1 and 3-6: your own data and reward through SFT, sweeps, a notebook's records, a switch of loss
and a checkpoint, each with the exact error where one is expected. Real Megatron-Core and vLLM on the nano model;
the task (reverse a word, a JSONL, a reward module in the user's folder) is :mod:`tests.reliability.own_task`."""

import importlib
import json
import math
import sys

import pytest

import rlkit
from rlkit.config.loading import load_config
from rlkit.envs import RewardFunctionEnvironment
from rlkit.errors import CheckpointError, ConfigError
from tests.reliability.own_task import task_overrides, write_task


@pytest.fixture(scope="module")
def task(tmp_path_factory):
    """The task folder, its module importable (as a user's working folder on sys.path would be)."""
    folder = tmp_path_factory.mktemp("own_task")
    data = write_task(folder)
    sys.path.insert(0, str(folder))
    yield folder, data, importlib.import_module("reverse_rewards")
    sys.path.remove(str(folder))
    sys.modules.pop("reverse_rewards", None)


@pytest.fixture(scope="module")
def session(task, tmp_path_factory):
    folder, data, rewards = task
    s = rlkit.Session.from_config("quickstart", task_overrides(tmp_path_factory.mktemp("session"), data),
                                  env=RewardFunctionEnvironment(rewards.reverse_reward))
    yield s
    s.close()


# ---- item 1: SFT on your own data ------------------------------------------------------------------------------
def test_a_file_dataset_with_sft_enabled_is_a_valid_config(task, tmp_path):
    config = load_config("quickstart", task_overrides(tmp_path, task[1]))  # was: ConfigError on every file dataset
    assert config.sft.enabled and config.data.path == str(task[1])


def test_sft_without_its_column_is_refused_after_loading_naming_the_columns_before_the_policy_starts(
        task, tmp_path, monkeypatch):
    from rlkit import builders
    from rlkit.startup import StartupReport

    data = write_task(tmp_path / "solutions", answer_key="solution")
    config = load_config("quickstart", task_overrides(tmp_path, data))

    def no_policy(config):
        raise AssertionError("the policy was started before the data's columns were checked")

    monkeypatch.setattr(builders, "build_policy", no_policy)
    with pytest.raises(ConfigError) as caught:
        builders.build_components(config, StartupReport())
    assert caught.value.problems == [
        f"sft.response_key='answer': the SFT warm start trains on the train data's 'answer' column, and "
        f"data.path='{data}' has none (its columns: prompt, solution). Fix: set sft.response_key to the answer "
        "column (sft.response_key=solution), or data.answer_key=solution to read it as 'answer'; or "
        "sft.enabled=false (RL only)"]


# ---- item 3: a reward function by import path; paired sweep grids ---------------------------------------------
def test_env_reward_fn_is_imported_from_the_working_folder(tmp_path, monkeypatch):
    from rlkit.builders import build_environment

    data = write_task(tmp_path / "cwd", module="cwd_rewards")
    monkeypatch.chdir(tmp_path / "cwd")  # not on sys.path: `rlkit train` run in the user's folder
    monkeypatch.setattr(sys, "path", [p for p in sys.path if p not in ("", str(tmp_path / "cwd"))])
    env = build_environment(load_config("quickstart", task_overrides(tmp_path, data, **{
        "env.reward_fn": "cwd_rewards:reverse_reward"})))
    assert isinstance(env, RewardFunctionEnvironment) and env.fn.__module__ == "cwd_rewards"
    out = env.step([[{"role": "user", "content": "reverse abc"}, {"role": "assistant", "content": c}]
                    for c in ("cba", "cbx", "xyz")], [{"prompt": "reverse abc", "answer": "cba"}] * 3)
    assert out.rewards.tolist() == pytest.approx([1.0, 0.2, 0.0])
    with pytest.raises(ConfigError) as caught:
        build_environment(load_config("quickstart", task_overrides(tmp_path, data, **{
            "env.reward_fn": "cwd_rewards:reverse"})))
    assert caught.value.problems == [f"env.reward_fn: module 'cwd_rewards' ({tmp_path / 'cwd' / 'cwd_rewards.py'}) "
                                     "has no function 'reverse'"]
    sys.modules.pop("cwd_rewards", None)


def test_grid_entries_tagged_with_one_group_are_paired_and_crossed_with_the_rest():
    from rlkit.sweep import parse_grid

    grid = parse_grid(["loss_fn.policy_loss@loss=ppo_clip,gspo", "seed=0,1", "loss_fn.ratio_clip_max@loss=0.2,4e-4",
                       "loss_fn.aggregation@loss=token_mean,seq_mean_token_mean"])
    assert grid == {("loss_fn.policy_loss", "loss_fn.ratio_clip_max", "loss_fn.aggregation"):
                    [("ppo_clip", 0.2, "token_mean"), ("gspo", 4e-4, "seq_mean_token_mean")], "seed": [0, 1]}
    with pytest.raises(ConfigError) as caught:
        parse_grid(["loss_fn.policy_loss@loss=ppo_clip,gspo", "loss_fn.ratio_clip_max@loss=0.2"])
    assert caught.value.problems == ["grid group @loss: its entries vary together and need as many values each, "
                                     "but loss_fn.policy_loss has 2, loss_fn.ratio_clip_max has 1"]


def test_a_paired_sweep_scores_with_your_reward_function(task, tmp_path):
    from rlkit.sweep import run_sweep

    folder, data, rewards = task
    pairs = {("loss_fn.policy_loss", "loss_fn.ratio_clip_min", "loss_fn.ratio_clip_max", "loss_fn.aggregation"):
             [("ppo_clip", 0.2, 0.2, "token_mean"), ("gspo", 3e-4, 4e-4, "seq_mean_token_mean")]}
    result = run_sweep("quickstart", pairs, task_overrides(tmp_path, data, **{
        "sft.enabled": False, "logger.wandb_enabled": False, "logger.sample_table_period": 1}),
        out_dir=tmp_path / "sweep", env=rewards.reverse_reward)
    assert [r.point for r in result.runs] == [tuple(zip(next(iter(pairs)), p)) for p in next(iter(pairs.values()))]
    assert result.runs[1].reused_session  # a loss change resets the session
    for run in result.runs:
        records = rlkit.open_run(run.run_dir)
        assert records.config["loss_fn"] == {**records.config["loss_fn"], **dict(
            (k.split(".")[1], v) for k, v in run.point)}
        samples = records.table("rollout/samples")
        answers = {r["prompt"]: r["answer"] for r in map(json.loads, data.read_text().splitlines())}
        expected = rewards.reverse_reward(None, list(samples["completion"]), [answers[p] for p in samples["prompt"]])
        assert samples["reward"].tolist() == pytest.approx(expected)  # the sweep's runs scored with it


# ---- item 1, with a session (after the tests that start their own: one session's engines at a time) ----------
def test_sft_trains_on_the_answer_only_after_the_chat_templated_prompt(session):
    from rlkit.data.chat import render_prompts
    from rlkit.data.sft import build_sft_batch

    result = session.sft(num_steps=2, progress=False)
    assert len(result.losses) == 2 and all(math.isfinite(x) for x in result.losses)
    tok = session.tokenizer
    rows = [dict(session.dataset["train"][i]) for i in range(3)]
    ids, attention, loss_mask = build_sft_batch(tok, rows, "answer")
    for i, row in enumerate(rows):
        prompt = render_prompts(tok, [row["prompt"]])[0]
        assert len(prompt) > len(tok.encode(row["prompt"], add_special_tokens=False))  # the chat template's tokens
        assert ids[i, :len(prompt)].tolist() == prompt and not loss_mask[i, :len(prompt)].any()
        assert ids[i][loss_mask[i]].tolist() == tok.encode(row["answer"], add_special_tokens=False) + [tok.eos_token_id]


# ---- item 5: a switch of loss brings its companion settings -------------------------------------------------------
def test_switching_to_gspo_by_name_applies_the_gspo_presets_clip_and_aggregation(session, capsys):
    session.configure(["loss_fn.policy_loss=gspo"])
    loss = session.config.loss_fn
    assert (loss.policy_loss, loss.ratio_clip_min, loss.ratio_clip_max, loss.aggregation) == (
        "gspo", 3e-4, 4e-4, "seq_mean_token_mean")
    assert session.loss_fn.params == loss
    assert ("loss_fn.policy_loss=gspo brought its companion settings from the gspo preset (loss_fn.ratio_clip_min=0.0003, "
            "loss_fn.ratio_clip_max=0.0004, loss_fn.aggregation=seq_mean_token_mean)") in capsys.readouterr().out
    session.configure(["loss_fn.policy_loss=ppo_clip", "loss_fn.ratio_clip_max=0.28"])  # a value named wins
    loss = session.config.loss_fn
    assert (loss.ratio_clip_min, loss.ratio_clip_max, loss.aggregation) == (0.2, 0.28, "token_mean")


# ---- item 4: a notebook session records like a CLI run ----------------------------------------------------------
def test_a_session_records_steps_trains_evaluations_and_tables_and_open_run_reads_them(session, tmp_path, capsys):
    start = session.step_count
    session.configure([f"logger.log_dir={tmp_path / 'nb'}", "logger.sample_table_period=1"])  # starts recording
    assert f"recording into {tmp_path / 'nb' / session.config.name}" in capsys.readouterr().out
    session.step()
    batch = session.advantages(session.logprobs(session.score(session.rollout())))
    session.train(batch)
    accuracy = session.evaluate().accuracy
    session.run(1, progress=False)
    session.configure(["logger.wandb_enabled=true"])  # live: the next record starts the wandb run
    session.step()
    records = rlkit.open_run(tmp_path / "nb" / session.config.name)
    steps = list(range(start + 1, start + 5))
    assert records.metrics["step"].tolist() == steps
    for step, metrics in zip(steps, session.history[start:]):
        row = records.metrics[records.metrics["step"] == step].iloc[0]
        assert row["rollout/reward_mean"] == pytest.approx(metrics["rollout/reward_mean"])
        assert row["train/loss"] == pytest.approx(metrics["train/loss"])
    assert records.metrics.loc[records.metrics["step"] == start + 2, "validation/accuracy"].item() == accuracy
    table = records.table("rollout/samples")
    assert sorted(set(table["step"])) == steps and len(table) == 4 * 8
    last = table[table["step"] == start + 4]
    assert last["completion"].tolist() == list(session.batch.completions[:8])
    assert list((tmp_path / "nb" / session.config.name / "wandb").glob("offline-run-*/run-*.wandb"))
    session.stop_logging()


def test_log_to_writes_the_run_folder_it_returns(session, tmp_path):
    folder = session.log_to(tmp_path / "logs")
    assert folder == tmp_path / "logs" / session.config.name and session.config.logger.log_dir == str(tmp_path / "logs")
    session.step()
    session.stop_logging()
    session.step()  # not recorded
    assert rlkit.open_run(folder).metrics["step"].tolist() == [session.step_count - 1]


# ---- item 8: an evaluation on part of the held-out rows says so ------------------------------------------------------
def test_an_evaluation_says_how_many_of_the_held_out_rows_it_covers(session):
    held_out = len(session.dataset["validation"])
    part = session.evaluate()
    assert part.num_prompts == 8 < held_out == part.held_out_rows
    assert f"on 8 of {held_out} (eval.num_prompts) held-out prompts" in repr(part)
    whole = session.evaluate(num_prompts=held_out)
    assert f"on {held_out} held-out prompts" in repr(whole)


# ---- item 6: Session.load keeps the environment; export_hf ---------------------------------------------------------
def test_export_hf_writes_the_policys_current_weights(session, tmp_path):
    from safetensors.torch import load_file

    folder = session.export_hf(tmp_path / "export")
    exported = {k: v for f in folder.glob("*.safetensors") for k, v in load_file(str(f)).items()}
    current = session.policy.hf_state_dict()
    assert (folder / "config.json").is_file() and set(exported) == set(current)
    assert all(exported[k].equal(current[k].to(exported[k].dtype)) for k in current)


def test_a_checkpoint_keeps_your_environment_or_refuses_with_the_env_fix(session, task, tmp_path):
    rewards = task[2]
    kept = session.save(tmp_path / "kept")
    own = session.env

    def notebook_reward(prompts, completions, **columns):
        return [0.0] * len(completions)

    session.env = RewardFunctionEnvironment(notebook_reward)
    unbuildable = session.save(tmp_path / "notebook")
    session.env = own
    with pytest.raises(CheckpointError) as caught:
        rlkit.Session.load(unbuildable)
    assert str(caught.value) == (
        f"{unbuildable} was saved by a session with an environment of yours, RewardFunctionEnvironment(fn="
        "'notebook_reward'), which a checkpoint cannot build again (its reward function is defined in a notebook or "
        f"__main__, or it is not a reward function). Fix: pass it again, Session.load('{unbuildable}', env=...), or "
        "put the reward function in a module and name it in the config (env.reward_fn: module:function)")
    step = session.step_count
    session.close()  # one session's engines at a time
    loaded = rlkit.Session.load(kept)
    try:
        assert isinstance(loaded.env, RewardFunctionEnvironment) and loaded.env.fn is rewards.reverse_reward
        assert loaded.step_count == step
    finally:
        loaded.close()

