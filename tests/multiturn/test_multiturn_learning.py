"""A shortened multiturn_quickstart: after the SFT warm start, GRPO over whole conversations raises held-out
success (the policy learns to call the calculator). The full preset's figures are in the README.

Slow (~4-6 minutes on 2 shared cores: the tiny model's SFT warm start on 64-token transcripts is most of it).
"""

import pytest

import rlkit


@pytest.mark.slow
def test_grpo_over_conversations_raises_held_out_success(tmp_path):
    overrides = {"policy.model_name": str(tmp_path / "model"), "logger.log_dir": str(tmp_path / "runs"),
                 "data.num_train": 5000, "data.num_validation": 100, "eval.num_prompts": 100}
    with rlkit.Session.from_config("multiturn_quickstart", overrides) as session:
        session.sft(progress=False)
        before = session.evaluate()
        history = session.run(30, progress=False)
        after = session.evaluate()
    calls = [m["rollout/turns_mean"] for m in history]
    assert after.accuracy >= before.accuracy + 0.10, (before.accuracy, after.accuracy)
    assert sum(calls[-5:]) / 5 > sum(calls[:5]) / 5  # more conversations go through the calculator


@pytest.mark.slow
def test_grpo_over_native_json_tool_calls_raises_held_out_success(tmp_path):
    """multiturn_quickstart_native shortened: the same task with the JSON tool add(a, b) called the Hermes way on the
    BPE model (a ~100-token transcript; the whole preset: 31% -> 97% held-out)."""
    overrides = {"policy.model_name": str(tmp_path / "model"), "logger.log_dir": str(tmp_path / "runs"),
                 "data.num_train": 5000, "data.num_validation": 100, "eval.num_prompts": 100}
    with rlkit.Session.from_config("multiturn_quickstart_native", overrides) as session:
        session.sft(progress=False)
        before = session.evaluate()
        session.run(30, progress=False)
        after = session.evaluate()
    assert after.accuracy >= before.accuracy + 0.10, (before.accuracy, after.accuracy)
    assert any("<tool_call>" in c for c in after.batch.completions)  # the held-out conversations call the tool
