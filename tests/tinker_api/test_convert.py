"""The generator/trainer mismatch figures of a Tinker batch, on hand-made logprobs: taken over the sampled tokens
only (a Tinker datum's sampler logprobs are 0 on the prompt), so a recipe's datums do not read as a broken refit
(found running tinker-cookbook's RL recipe against the service: token_mult_prob_error ~4e4 at every step)."""

import math
import warnings

import numpy as np
import pytest
import torch

from rlkit.tinker_api.convert import Datum, datums_to_batch, sampled_mismatch

TOKENS = [5, 6, 7, 8, 9, 10]  # a 3-token prompt, then 3 sampled tokens
TRAINER = torch.tensor([[0.0, -3.0, -2.5, -0.5, -1.0, -0.25]])  # [1, 6] rlkit positions (position 0 has none)


def scored(sampler_logprobs, loss_fn="importance_sampling"):
    """The datum's batch as the logprobs stage leaves it, with TRAINER as the trainer's logprobs."""
    inputs = {"target_tokens": np.array(TOKENS[1:]), "advantages": np.array([0, 0, 1.0, 1.0, 1.0]),
              "logprobs": np.array(sampler_logprobs, dtype=np.float32)}
    if loss_fn == "cross_entropy":
        inputs = {"target_tokens": inputs["target_tokens"], "weights": np.ones(5)}
    batch = datums_to_batch([Datum(tuple(TOKENS[:-1]), inputs)], loss_fn, {}, pad_token_id=0, policy_version=0)
    return batch.with_(prev_logprobs=TRAINER * batch.loss_mask, info={"token_mult_prob_error": 9e9})


def test_the_prompt_zeros_do_not_count_and_the_sampled_tokens_do():
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # a batch whose sampled tokens agree does not warn
        out = sampled_mismatch(scored([0.0, 0.0, -0.5, -1.0, -0.25]), threshold=1e-2)
    assert out.info["token_mult_prob_error"] == 1.0 and out.info["logprob_abs_diff_max"] == 0.0
    off = scored([0.0, 0.0, -0.5, -1.0, -0.75])  # the last sampled token off by 0.5
    with pytest.warns(UserWarning, match="disagree on the sampled tokens"):
        out = sampled_mismatch(off, threshold=1e-2)
    assert out.info["token_mult_prob_error"] == pytest.approx((2 + math.exp(0.5)) / 3)
    assert out.info["logprob_abs_diff_max"] == pytest.approx(0.5)


def test_a_cross_entropy_batch_gets_no_figure():
    out = sampled_mismatch(scored(None, "cross_entropy"), threshold=1e-2)
    assert not {"token_mult_prob_error", "logprob_abs_diff_max", "logprob_abs_diff_mean"} & set(out.info)
