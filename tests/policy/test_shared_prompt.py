"""Each prompt computed once for its group (:mod:`rlkit.policy.megatron.shared_prompt`,
``policy.megatron_cfg.share_prompts``): the layout by hand, and against the ordinary rows the same logprobs, entropy,
gradients and train step from a decoder pass over fewer tokens.

Bounds: logprobs and entropy 1e-5, gradients 1e-5 relative to each parameter's largest gradient (fp32; the two
differ in the order of sums only: measured ~5e-7)."""

import pytest
import torch

from rlkit.config.backends import MegatronConfig
from rlkit.config.components import LoraConfig, PolicyConfig
from rlkit.policy.megatron import shared_prompt
from rlkit.policy.megatron.policy import MegatronPolicy
from rlkit.policy.megatron.shared_prompt import share_prompts
from tests.helpers import pg_token_mean_loss, random_batch


def grouped_batch(b=8, t=24, prompt_len=10, group_size=4, seed=0):
    """random_batch whose rows share their prompt within each group of ``group_size`` rows (GRPO's layout)."""
    batch = random_batch(b=b, t=t, prompt_len=prompt_len, group_size=group_size, seed=seed)
    ids = batch.input_ids.clone()
    for row in range(b):
        ids[row, :prompt_len] = ids[(row // group_size) * group_size, :prompt_len]
    return batch.with_(input_ids=ids)


def test_the_layout_of_one_group_by_hand():
    ids = torch.tensor([[5, 6, 7, 8, 0], [5, 6, 9, 0, 0]])  # prompt [5, 6]; completions [7, 8] and [9]
    attention = ids != 0
    scored = torch.tensor([[0, 0, 1, 1, 0], [0, 0, 1, 0, 0]], dtype=torch.bool)
    s = share_prompts(ids, attention, scored)
    assert s.input_ids.tolist() == [[5, 6, 7, 8, 9]] and s.positions.tolist() == [[0, 1, 2, 3, 2]]
    allowed = (~s.mask[0, 0]).int().tolist()
    assert allowed == [[1, 0, 0, 0, 0],
                       [1, 1, 0, 0, 0],
                       [1, 1, 1, 0, 0],  # 7: the prompt and itself
                       [1, 1, 1, 1, 0],  # 8: the prompt, 7, itself
                       [1, 1, 0, 0, 1]]  # 9: the prompt and itself, not the other completion
    # each scored token, the position that predicts it, and where it goes back
    assert s.source.tolist() == [[0, 1], [0, 2], [0, 1]] and s.targets.tolist() == [7, 8, 9]
    assert s.where.tolist() == [[0, 2], [0, 3], [1, 2]]


def test_nothing_to_share_gives_the_ordinary_rows():
    batch = random_batch(b=4, t=12, prompt_len=4)  # four different prompts
    assert share_prompts(batch.input_ids, batch.attention_mask, batch.loss_mask) is None
    assert share_prompts(batch.input_ids, batch.attention_mask, torch.zeros_like(batch.loss_mask)) is None


def test_padding_of_a_shorter_group_attends_to_itself_only():
    batch = grouped_batch(b=6, group_size=3, seed=3)
    s = share_prompts(batch.input_ids, batch.attention_mask, batch.loss_mask)
    allowed = ~s.mask[:, 0]
    assert allowed.any(-1).all()  # no fully masked query row (it would put NaN into backward)
    assert s.input_ids.shape[0] == 2 and s.input_ids.shape[1] < 3 * 24


def run(policy_kwargs, share, batch, train=False):
    policy = MegatronPolicy(PolicyConfig(**policy_kwargs, megatron_cfg=MegatronConfig(
        share_prompts=share, fused_head_chunk_mib=1e-4)))  # (small chunks: the fused head, as a 49k vocabulary)
    decoder_tokens = []
    forward = policy.adapter._forward_module.forward
    policy.adapter._forward_module.forward = lambda ids, *a, **k: decoder_tokens.append(ids.numel()) or forward(ids, *a, **k)
    try:
        scores = policy.logprobs(batch.input_ids, batch.attention_mask, with_entropy=True, scored=batch.loss_mask)
        if train:
            step = policy.train_step(batch, pg_token_mean_loss, return_logprobs=True)
            return scores, step, dict(policy.model.named_parameters()), decoder_tokens
        policy.compute_gradients(batch, pg_token_mean_loss)
        grads = {n: (p.main_grad if getattr(p, "main_grad", None) is not None else p.grad).clone()
                 for n, p in policy.model.named_parameters() if p.requires_grad}
        return scores, grads, decoder_tokens
    finally:
        policy.close()


@pytest.mark.parametrize("lora", [False, True])
def test_the_same_scores_and_gradients_from_fewer_tokens(model_factory, lora):
    kwargs = dict(model_name=str(model_factory("nano", "llama")), train_micro_batch_size=8,
                  lora_cfg=LoraConfig(enabled=lora, dim=4, alpha=8))
    batch = grouped_batch()
    (rows, row_grads, row_tokens), (shared, shared_grads, shared_tokens) = (run(kwargs, s, batch) for s in (0, 1))
    mask = batch.loss_mask
    for a, b in ((rows.logprobs, shared.logprobs), (rows.entropy, shared.entropy)):
        assert (a[mask] - b[mask]).abs().max() < 1e-5 and (b[~mask] == 0).all()
    assert row_grads.keys() == shared_grads.keys() and row_grads
    for name, g in row_grads.items():
        assert (g - shared_grads[name]).abs().max() <= 1e-5 * max(g.abs().max(), 1e-12), name
    # two passes each (logprobs, gradients): the shared one over the groups' sequences
    assert sum(shared_tokens) < 0.75 * sum(row_tokens)


def test_a_train_step_equals_the_ordinary_rows(model_factory):
    kwargs = dict(model_name=str(model_factory("nano", "llama")), train_micro_batch_size=4)  # two groups a microbatch
    batch = grouped_batch(seed=1)
    (_, a, weights_a, _), (_, b, weights_b, _) = (run(kwargs, s, batch, train=True) for s in (0, 1))
    assert abs(a.metrics["loss"] - b.metrics["loss"]) < 1e-6 and abs(a.grad_norm - b.grad_norm) < 1e-5 * a.grad_norm
    assert (a.logprobs - b.logprobs)[batch.loss_mask].abs().max() < 1e-5
    assert max((weights_a[n] - weights_b[n]).abs().max() for n in weights_a) < 1e-6


def test_rope_takes_each_tokens_own_position(model_factory):
    """The rotary embedding under :func:`shared_prompt.rope_at` gives row r's token s the angle of positions[r, s]."""
    policy = MegatronPolicy(PolicyConfig(model_name=str(model_factory("nano", "llama"))))
    try:
        from megatron.core.utils import unwrap_model

        gpt = unwrap_model(policy.adapter._forward_module)
        full = gpt.rotary_pos_emb.get_emb(8)  # [8, 1, 1, dim]
        positions = torch.tensor([[0, 1, 2, 2], [0, 5, 6, 7]])
        with shared_prompt.rope_at(gpt, positions):
            emb = gpt.rotary_pos_emb(4)
        assert emb.shape == (4, 2, 1, full.shape[-1])
        assert torch.equal(emb[3, 0, 0], full[2, 0, 0]) and torch.equal(emb[1, 1, 0], full[5, 0, 0])
        assert gpt.rotary_pos_emb(4).shape[1] == 1  # closed: the class's own forward again
    finally:
        policy.close()
