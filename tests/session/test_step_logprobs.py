"""``Session.step()`` takes a batch's logprobs from its one train step when it can, instead of a separate pass:
the same training and the same records as the stages run by hand, bitwise where the two forwards see the same
microbatches; and the separate pass wherever the train step cannot stand in for it."""

import pytest
import torch

import rlkit
from rlkit.envs import RewardFunctionEnvironment
from rlkit.stages import TrainSettings, one_update, train
from tests.helpers import pg_token_mean_loss, random_batch
from tests.session.conftest import tiny_overrides, varied_reward

SAME_MICROBATCHES = {"policy.train_micro_batch_size": 16, "policy.logprob_batch_size": 16}  # 4 prompts x 4


def by_hand(s):
    """One RL step as a notebook runs it, stage by stage, with the logprobs pass."""
    batch = s.advantages(s.logprobs(s.score(s.rollout())))
    metrics = s.train(batch)
    s.refit()
    return metrics


@pytest.mark.parametrize("dynamic_sampling", [False, True], ids=["plain", "dynamic_sampling"])
def test_step_equals_the_stages_by_hand_bitwise(tmp_path, dynamic_sampling):
    overrides = tiny_overrides(tmp_path, **SAME_MICROBATCHES, **{"grpo.use_dynamic_sampling": dynamic_sampling})
    runs = {}
    for name, one_step in (("step", lambda s: s.step()), ("by hand", by_hand)):
        with rlkit.Session.from_config("quickstart", overrides, env=RewardFunctionEnvironment(varied_reward)) as s:
            records = [one_step(s) for _ in range(3)]
            runs[name] = records, s.batch, s.policy.hf_state_dict()
    (fused, fused_batch, fused_weights), (separate, separate_batch, separate_weights) = runs["step"], runs["by hand"]
    assert all(m["timing/logprobs"] == 0 for m in fused) and all(m["timing/logprobs"] > 0 for m in separate)
    for a, b in zip(fused, separate):
        assert {k: v for k, v in a.values.items() if not k.startswith("timing/")} == \
               {k: v for k, v in b.values.items() if not k.startswith("timing/")}
    for field in ("prev_logprobs", "entropy", "advantages"):
        assert torch.equal(getattr(fused_batch, field), getattr(separate_batch, field)), field
    assert fused_batch.info["token_mult_prob_error"] == separate_batch.info["token_mult_prob_error"]
    assert all(torch.equal(fused_weights[k], separate_weights[k]) for k in separate_weights)


def test_the_logprobs_pass_runs_where_the_train_step_cannot_stand_in(tmp_path):
    def custom_loss(logprobs, batch, counts):  # a loss of yours may read prev_logprobs itself
        assert batch.prev_logprobs is not None
        return pg_token_mean_loss(logprobs, batch, counts)

    env = RewardFunctionEnvironment(varied_reward)
    cases = [({"grpo.num_epochs": 2}, None), ({"policy.train_global_batch_size": 8}, None),
             ({"loss_fn.reference_policy_kl_penalty": 0.01}, None), ({}, custom_loss)]
    for i, (extra, loss_fn) in enumerate(cases):
        overrides = tiny_overrides(tmp_path / str(i), **extra, **{"policy.model_name": str(tmp_path / "model")})
        with rlkit.Session.from_config("quickstart", overrides, env=env, loss_fn=loss_fn) as s:
            m = s.step()
            assert m["timing/logprobs"] > 0 and s.batch.prev_logprobs is not None, (extra, loss_fn)


def test_on_policy_training_takes_exactly_one_update():
    assert one_update(16) and one_update(16, 1, 16) and not one_update(16, 2) and not one_update(16, 1, 8)
    batch = random_batch(b=8).with_(prev_logprobs=None)
    with pytest.raises(ValueError, match="num_epochs=2 .* run the logprobs stage first"):
        train(batch, None, pg_token_mean_loss, TrainSettings(num_epochs=2), on_policy=True)
