"""Small builders shared by tests (importable as ``tests.helpers``)."""

import torch

from rlkit.trajectories import LossCounts, Trajectories


def random_batch(b=8, t=20, vocab=100, prompt_len=5, seed=0, group_size=1) -> Trajectories:
    """A Trajectories batch with random tokens, ragged completion lengths and random advantages."""
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(3, vocab, (b, t), generator=g)
    lengths = torch.randint(prompt_len + 2, t + 1, (b,), generator=g)
    pos = torch.arange(t).unsqueeze(0)
    attention = pos < lengths.unsqueeze(1)
    loss_mask = attention & (pos >= prompt_len)
    ids = torch.where(attention, ids, torch.zeros_like(ids))
    adv = torch.randn(b, 1, generator=g).expand(b, t) * loss_mask
    return Trajectories(
        prompts=("p",) * b, completions=("c",) * b, input_ids=ids, attention_mask=attention,
        loss_mask=loss_mask, generator_logprobs=torch.zeros(b, t), finish_reasons=("stop",) * b,
        group_size=group_size, policy_version=0, advantages=adv,
    )


def pg_token_mean_loss(logprobs, batch: Trajectories, counts: LossCounts):
    """-advantage * logprob, summed over valid tokens and divided by the global valid-token count."""
    per_token = -batch.advantages * logprobs * batch.loss_mask
    loss = per_token.sum() / counts.valid_tokens
    return loss, {"loss": loss.detach()}
