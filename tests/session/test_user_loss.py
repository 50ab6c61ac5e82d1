"""A loss function given to the constructor (or assigned) stays the session's: configure() and reset() keep
it, and a change of the config's loss keys warns that it does not reach it. Only the RLLoss the config
describes follows the config."""

import dataclasses
import math
import warnings

import pytest

import rlkit
from rlkit.algorithms import RLLoss
from tests.helpers import pg_token_mean_loss
from tests.session.conftest import tiny_overrides, varied_reward


@pytest.fixture(scope="module")
def user_session(tmp_path_factory):
    from rlkit.envs import RewardFunctionEnvironment

    s = rlkit.Session.from_config("quickstart", tiny_overrides(tmp_path_factory.mktemp("user-loss")),
                                  env=RewardFunctionEnvironment(varied_reward), loss_fn=pg_token_mean_loss)
    yield s
    s.close()


def test_a_constructor_loss_survives_configure_and_reset(user_session):
    s = user_session
    assert "train/pg_loss" not in s.step().values  # RLLoss reports pg_loss; the user's loss does not
    s.configure(["grpo.max_num_steps=7"])
    assert s.loss_fn is pg_token_mean_loss and s.config.grpo.max_num_steps == 7
    with pytest.warns(UserWarning, match=r"loss_fn\.ratio_clip_max changed, but this session trains with a loss "
                                         r"function you supplied .* does not reach it"):
        s.configure(["loss_fn.ratio_clip_max=0.3"])
    assert s.loss_fn is pg_token_mean_loss and s.config.loss_fn.ratio_clip_max == 0.3
    s.reset(["grpo.max_num_steps=3"])
    assert s.loss_fn is pg_token_mean_loss and s.step_count == 0 and s.config.grpo.max_num_steps == 3
    metrics = s.step()
    assert "train/pg_loss" not in metrics.values and math.isfinite(metrics["train/loss"])


def test_a_loss_assigned_later_is_kept_too(user_session):
    s = user_session
    mine = RLLoss(dataclasses.replace(s.config.loss_fn, ratio_clip_max=0.5))
    s.loss_fn = mine
    with pytest.warns(UserWarning, match="loss function you supplied"):
        s.configure(["loss_fn.ratio_clip_min=0.1"])
    assert s.loss_fn is mine and s.loss_fn.params.ratio_clip_max == 0.5
    assert "train/pg_loss" in s.step().values
    s.loss_fn = RLLoss(s.config.loss_fn)  # the configured loss again (tutorial 04 does this): it follows the config
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        s.configure(["loss_fn.ratio_clip_min=0.15"])
    assert type(s.loss_fn) is RLLoss and s.loss_fn.params == s.config.loss_fn and s.loss_fn.params.ratio_clip_min == 0.15
