"""Training step of the Megatron policy: normalisation across microbatches, atomicity, reference policy."""

import pytest
import torch

from rlkit.config.components import PolicyConfig
from rlkit.policy.megatron.policy import MegatronPolicy
from tests.helpers import pg_token_mean_loss, random_batch


@pytest.fixture
def policy(model_factory):
    p = MegatronPolicy(PolicyConfig(model_name=str(model_factory("nano", "qwen2")), train_micro_batch_size=8))
    yield p
    p.close()


def gradients(policy, batch, micro, loss_fn=pg_token_mean_loss):
    policy.cfg = policy.cfg.model_copy(update={"train_micro_batch_size": micro})
    policy.compute_gradients(batch, loss_fn)
    return {n: p.grad.clone() for n, p in policy.model.named_parameters()}


def test_gradient_is_the_same_over_1_2_and_4_microbatches(policy):
    batch = random_batch(b=8, t=24)
    whole = gradients(policy, batch, micro=8)
    for micro in (4, 2):
        split = gradients(policy, batch, micro=micro)
        worst = max((split[n] - whole[n]).abs().max().item() for n in whole)
        assert worst < 1e-5, (micro, worst)


def test_per_microbatch_normalisation_would_be_caught(policy):
    """The check above can fail: normalising by the microbatch's own token count changes the gradient."""

    def local_mean(logprobs, batch, counts):
        loss = (-batch.advantages * logprobs * batch.loss_mask).sum() / batch.loss_mask.sum()
        return loss, {}

    batch = random_batch(b=8, t=24)
    whole = gradients(policy, batch, micro=8, loss_fn=local_mean)
    split = gradients(policy, batch, micro=2, loss_fn=local_mean)
    assert max((split[n] - whole[n]).abs().max().item() for n in whole) > 1e-4


def test_train_step_updates_weights_and_keeps_the_reference(policy):
    batch = random_batch(b=8, t=24)
    before = policy.logprobs(batch.input_ids, batch.attention_mask).logprobs
    result = policy.train_step(batch, pg_token_mean_loss)
    after = policy.logprobs(batch.input_ids, batch.attention_mask).logprobs
    reference = policy.reference_logprobs(batch.input_ids, batch.attention_mask).logprobs
    assert result.version == policy.version == 1 and result.grad_norm > 0
    assert (after - before).abs().max() > 1e-4
    assert torch.equal(reference, before)
    assert torch.equal(policy.logprobs(batch.input_ids, batch.attention_mask).logprobs, after)  # swapped back
    # the objective went down: advantage-weighted logprob went up
    gain = lambda lp: (batch.advantages * lp * batch.loss_mask).sum()  # noqa: E731
    assert gain(after) > gain(before)


def test_interrupted_step_changes_nothing(policy):
    batch = random_batch(b=8, t=24)
    policy.cfg = policy.cfg.model_copy(update={"train_micro_batch_size": 2})
    policy.train_step(batch, pg_token_mean_loss)  # optimizer state exists
    weights = {n: p.detach().clone() for n, p in policy.model.named_parameters()}
    opt_state = {k: {s: v.clone() for s, v in st.items()} for k, st in policy.optimizer.state.items()}
    calls = []

    def interrupting(logprobs, micro, counts):
        calls.append(1)
        if len(calls) == 3:
            raise KeyboardInterrupt
        return pg_token_mean_loss(logprobs, micro, counts)

    with pytest.raises(KeyboardInterrupt):
        policy.train_step(batch, interrupting)
    assert policy.version == 1
    for n, p in policy.model.named_parameters():
        assert torch.equal(p, weights[n]) and p.grad is None
    for k, st in policy.optimizer.state.items():
        assert all(torch.equal(v, opt_state[k][s]) for s, v in st.items())
    policy.train_step(batch, pg_token_mean_loss)  # the next call works
    assert policy.version == 2


def test_entropy_matches_float64_reference(policy):
    batch = random_batch(b=4, t=16)
    scores = policy.logprobs(batch.input_ids, batch.attention_mask, with_entropy=True)
    with torch.no_grad():
        logits = policy.adapter.logits(batch.input_ids).double().cpu()
    logp = logits.log_softmax(-1)
    ent = -(logp.exp() * logp).sum(-1)[:, :-1]
    expected = torch.nn.functional.pad(ent, (1, 0)) * batch.attention_mask
    lp = logp[:, :-1].gather(-1, batch.input_ids[:, 1:, None]).squeeze(-1)
    expected_lp = torch.nn.functional.pad(lp, (1, 0)) * batch.attention_mask
    assert (scores.entropy.double() - expected).abs().max() < 1e-5
    assert (scores.logprobs.double() - expected_lp).abs().max() < 1e-5


def test_entropy_in_row_chunks_equals_the_whole_batch_at_once(policy, monkeypatch):
    """The entropy a pipeline's last stage computes from its logits (:func:`shifted_entropy`) bounds its working
    copies by ``ENTROPY_CHUNK_BYTES``: one row per chunk (three all-reduces per chunk) gives bitwise the entropy of
    all rows at once."""
    import rlkit.policy.megatron.scores as scores
    from megatron.core import parallel_state as ps

    reduces = []
    all_reduce = scores.dist.all_reduce
    monkeypatch.setattr(scores.dist, "all_reduce", lambda *a, **k: reduces.append(1) or all_reduce(*a, **k))
    batch = random_batch(b=4, t=16)
    with torch.no_grad():
        logits = policy.adapter.logits(batch.input_ids)
    whole = scores.shifted_entropy(logits, ps.get_tensor_model_parallel_group())
    at_once, reduces[:] = len(reduces), []
    monkeypatch.setattr(scores, "ENTROPY_CHUNK_BYTES", 1)  # one row per chunk
    chunked = scores.shifted_entropy(logits, ps.get_tensor_model_parallel_group())
    assert len(reduces) - at_once == 3 * (4 - 1)  # four chunks instead of one
    assert torch.equal(chunked, whole)
