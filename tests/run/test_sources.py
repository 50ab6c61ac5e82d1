"""The three rollout sources over a RunState: which prompt rows and seeds each asks the generator for.

The generator and the environment are stand-ins here (these tests are about the sources' bookkeeping:
rows, rounds, seeds, switching); real sessions run each source in tests/session."""

import warnings

import pytest
import torch

from rlkit.data import PromptSampler
from rlkit.run.state import RunState
from rlkit.run.sources import ROUND_SEED_STRIDE, AsyncSource, DynamicSampling, PlainRollouts, step_seed
from tests.helpers import random_batch

ROWS = [{"prompt": f"p{i}", "vary": i % 3 == 0} for i in range(30)]
G = 2


class FakeGenerator:
    """sample(rows, seed, version): a batch of G samples per row, recording each call."""

    def __init__(self):
        self.calls = []

    def sample(self, rows, seed, version):
        self.calls.append(([r["prompt"] for r in rows], seed, version))
        return random_batch(b=len(rows) * G, group_size=G).with_(rows=tuple(rows), policy_version=version)

    @staticmethod
    def score(batch):
        """Rewards vary within a group only for rows marked ``vary``."""
        rewards = [float(i % G) if row["vary"] else 1.0 for row in batch.rows for i in range(G)]
        return batch.with_(rewards=torch.tensor(rewards))


def fresh_run():
    return RunState(PromptSampler(ROWS, batch_size=4, seed=0))


def order(n):
    return [r["prompt"] for r in PromptSampler(ROWS, batch_size=4, seed=0).next_batch(n)]


def test_plain_samples_the_steps_rows_with_the_given_seed_and_again_the_same():
    gen, run = FakeGenerator(), fresh_run()
    source = PlainRollouts(gen.sample, 4)
    a, b = source.batch(run, 11, 3, 3), source.batch(run, 11, 3, 3)
    assert gen.calls == [(order(4), 11, 3)] * 2 and a.rewards is None and a.policy_version == 3
    assert [r["prompt"] for r in b.rows] == order(4) and run.sampler.position == 4
    with pytest.warns(UserWarning, match="off-policy"):
        source.batch(run, 11, 2, 3)


def test_dynamic_sampling_scores_rounds_of_the_steps_rows_with_strided_seeds():
    gen, run = FakeGenerator(), fresh_run()
    source = DynamicSampling(gen.sample, gen.score, 4, max_rounds=3)
    batch = source.batch(run, 100, 0, 0)
    rows = order(12)
    assert run.sampler.position == 12  # all three rounds' rows drawn at the start of the step
    rounds = gen.calls
    assert [c[0] for c in rounds] == [rows[r * 4:(r + 1) * 4] for r in range(len(rounds))]
    assert [c[1] for c in rounds] == [100 + ROUND_SEED_STRIDE * r for r in range(len(rounds))]
    kept = [r["prompt"] for r in batch.rows]
    expected = [r["prompt"] for r in PromptSampler(ROWS, 4, seed=0).next_batch(12) if r["vary"]][:4]
    assert len(rounds) >= 2  # the first round alone did not fill the batch
    assert kept == expected and batch.rewards is not None
    assert batch.info["dynamic_sampling/kept_groups"] == len(expected)
    assert batch.info["dynamic_sampling/tries"] == len(rounds)


def test_switching_sources_within_a_step_reuses_the_drawn_rows():
    gen, run = FakeGenerator(), fresh_run()
    PlainRollouts(gen.sample, 4).batch(run, 5, 0, 0)
    DynamicSampling(gen.sample, gen.score, 4, max_rounds=2).batch(run, 5, 0, 0)
    assert gen.calls[1][0] == gen.calls[0][0] == order(4)  # round 0 = the plain rollout's prompts
    assert run.sampler.position == 8 and [r["prompt"] for r in run.step_rows] == order(8)  # only 4 more drawn
    PlainRollouts(gen.sample, 4).batch(run, 5, 0, 0)
    assert gen.calls[-1][0] == order(4) and run.sampler.position == 8  # back to plain: the first 4 again
    PlainRollouts(gen.sample, 6).batch(run, 5, 0, 0)  # a larger step: the rows already drawn come first
    assert gen.calls[-1][0] == order(6) and run.sampler.position == 8


def test_async_source_makes_batch_i_with_the_seed_of_step_i_in_the_producer():
    gen, run = FakeGenerator(), fresh_run()
    source = AsyncSource(PlainRollouts(gen.sample, 4), run, run_seed=3, max_age_steps=1,
                         updates_per_step=lambda: 1, generator_version=0)
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("error")  # lagged batches are async GRPO's design: no off-policy warning
            batch = source.batch(run, seed=999, generator_version=0, policy_version=1)
        assert gen.calls[0] == (order(4), step_seed(3, 0), 0) and batch.policy_version == 0
        assert source.batch(run, 999, 0, 1) is batch  # the same batch again within the step
        assert "async rollouts of PlainRollouts(4 prompts per step): AsyncRollouts(max_age=1" in repr(source)
        assert run.step_rows == []  # prompts are drawn in the producer, not kept as the step's
    finally:
        source.close()
