"""The fused head (:mod:`rlkit.policy.megatron.head`): logprobs, entropy and gradients equal those of the unfused
head (full logits, then Megatron's vocabulary-parallel cross-entropy), and no [tokens, V] tensor is made.

Bounds: logprobs and entropy 1e-6, gradients 1e-6 relative to each parameter's largest gradient (fp32; the two
differ in summation order only). Tensor and sequence parallelism: tests/policy/test_parallel.py, with small chunks.
"""

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

from rlkit.config.components import GenerationConfig, PolicyConfig, SequencePackingConfig
from rlkit.policy.megatron import head
from rlkit.policy.megatron.policy import MegatronPolicy
from tests.helpers import pg_token_mean_loss, random_batch


def unfused(policy, monkeypatch) -> None:
    """The same policy's scores through full logits from now on (the loop's own scores, as a pipeline stage
    computes): its adapter offers no fused scores."""
    monkeypatch.setattr(policy.adapter, "fused_scores", lambda *args, **kwargs: None)


def chunk_of(policy, monkeypatch, tokens: int) -> None:
    """The policy's fused head scores ``tokens`` tokens a chunk (``policy.megatron_cfg.fused_head_chunk_mib``)."""
    mib = 4 * policy.adapter.arch.vocab_size * tokens / 2**20
    mc = policy.cfg.megatron_cfg.model_copy(update={"fused_head_chunk_mib": mib})
    monkeypatch.setattr(policy.adapter, "cfg", policy.cfg.model_copy(update={"megatron_cfg": mc}))
    assert policy.cfg.megatron_cfg.fused_head_chunk_bytes == 4 * policy.adapter.arch.vocab_size * tokens


def scores_and_gradients(policy, batch):
    policy.compute_gradients(batch, pg_token_mean_loss)
    grads = {n: p.grad.clone() for n, p in policy.model.named_parameters()}
    return policy.logprobs(batch.input_ids, batch.attention_mask, with_entropy=True), grads


@pytest.mark.parametrize("family,overrides,packing,temperature", [
    ("qwen2", {}, False, 1.0),  # untied head, QKV bias
    ("llama", {"tie_word_embeddings": True}, False, 0.7),  # tied: the embedding's gradient from both ends
    ("qwen3", {}, True, 1.0),  # rows packed into one sequence
])
def test_fused_head_equals_the_unfused_one(model_factory, monkeypatch, family, overrides, packing, temperature):
    cfg = PolicyConfig(model_name=str(model_factory("nano", family, **overrides)), train_micro_batch_size=4,
                       generation=GenerationConfig(temperature=temperature),
                       sequence_packing=SequencePackingConfig(enabled=packing))
    policy = MegatronPolicy(cfg)
    try:
        assert policy.adapter.arch.tie_word_embeddings == bool(overrides)
        chunk_of(policy, monkeypatch, 5)  # many chunks
        batch = random_batch(b=6, t=20)
        fused, fused_grads = scores_and_gradients(policy, batch)
        unfused(policy, monkeypatch)
        plain, plain_grads = scores_and_gradients(policy, batch)
    finally:
        policy.close()
    assert (fused.logprobs - plain.logprobs).abs().max() < 1e-6
    assert (fused.entropy - plain.entropy).abs().max() < 1e-6
    assert fused.logprobs.abs().max() > 1  # (scores of a random model: far from 0)
    for name, g in plain_grads.items():
        assert (fused_grads[name] - g).abs().max() <= 1e-6 * g.abs().max(), name


class LargestTensor(TorchDispatchMode):
    """Records the largest tensor any op returns."""

    def __init__(self):
        super().__init__()
        self.largest = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        for t in out if isinstance(out, (tuple, list)) else [out]:
            if isinstance(t, torch.Tensor):
                self.largest = max(self.largest, t.numel())
        return out


def test_a_train_step_never_holds_the_logits_of_all_tokens(model_factory, monkeypatch):
    """Through the fused head the largest tensor of a step is a chunk's logits or the gradient buffer of all
    weights; through full logits it is [tokens, V] (checked, so the bound can fail)."""
    policy = MegatronPolicy(PolicyConfig(model_name=str(model_factory("nano", "qwen2", vocab_size=4096)),
                                         train_micro_batch_size=8))
    try:
        vocab, batch = policy.adapter.arch.vocab_size, random_batch(b=8, t=40)
        tokens = 8 * int(batch.attention_mask.sum(1).max())
        weights = sum(p.numel() for p in policy.model.parameters())  # (DDP's gradient buffer holds them all)
        chunk_of(policy, monkeypatch, 4)
        sizes = []
        for full_logits in (False, True):
            if full_logits:
                unfused(policy, monkeypatch)
            with LargestTensor() as seen:
                policy.train_step(batch, pg_token_mean_loss)
            sizes.append(seen.largest)
    finally:
        policy.close()
    assert tokens * vocab > 2 * max(weights, 4 * vocab)  # the nano model's logits dwarf its chunks and weights
    assert sizes[0] <= max(weights, 4 * vocab)
    assert sizes[1] >= tokens * vocab


def test_logits_within_one_chunk_go_through_the_unfused_head(model_factory, monkeypatch):
    """Below one chunk of logits nothing is saved by fusing, and the full logits keep a small run's trajectory as it
    was (its rounding decides where a long run goes); past it, the fused head scores."""
    policy = MegatronPolicy(PolicyConfig(model_name=str(model_factory("nano", "qwen2")), train_micro_batch_size=8))
    calls = []
    scores = head.head_scores
    monkeypatch.setattr(head, "head_scores", lambda *a, **k: calls.append(1) or scores(*a, **k))
    try:
        batch = random_batch(b=4, t=16)
        small = policy.logprobs(batch.input_ids, batch.attention_mask).logprobs
        assert calls == []
        chunk_of(policy, monkeypatch, 8)
        fused = policy.logprobs(batch.input_ids, batch.attention_mask).logprobs
        assert calls == [1] and (fused - small).abs().max() < 1e-6
    finally:
        policy.close()


@pytest.mark.parametrize("packing", [False, True])
def test_the_fused_head_computes_logits_only_where_scored(model_factory, monkeypatch, packing):
    """With ``scored`` (the loss mask: a short reply's row is mostly prompt), the head multiplies only the rows that
    predict a scored token: the logprobs and entropy there equal the unscored pass's (1e-6), 0 elsewhere; a train
    step's gradients are those of the unfused head (test above), and its head gets only the completion's rows."""
    policy = MegatronPolicy(PolicyConfig(model_name=str(model_factory("nano", "llama")), train_micro_batch_size=8,
                                         sequence_packing=SequencePackingConfig(enabled=packing)))
    rows = []  # the rows (tokens) each fused-head call gets
    apply = head._ChunkedHeadLogprobs.apply
    monkeypatch.setattr(head._ChunkedHeadLogprobs, "apply", lambda r, *a: rows.append(r.shape[0]) or apply(r, *a))
    try:
        chunk_of(policy, monkeypatch, 4)
        batch = random_batch(b=6, t=24, prompt_len=10)
        every = policy.logprobs(batch.input_ids, batch.attention_mask, with_entropy=True)
        all_rows, rows[:] = sum(rows), []
        some = policy.logprobs(batch.input_ids, batch.attention_mask, with_entropy=True, scored=batch.loss_mask)
        scored_rows, rows[:] = sum(rows), []
        policy.train_step(batch, pg_token_mean_loss)
        train_rows = sum(rows)
    finally:
        policy.close()
    mask = batch.loss_mask
    for a, b in ((some.logprobs, every.logprobs), (some.entropy, every.entropy)):
        assert (a[mask] - b[mask]).abs().max() < 1e-6 and (a[~mask] == 0).all()
    prompt = ~mask & batch.attention_mask
    prompt[:, 0] = False  # (position 0 predicts nothing)
    assert every.logprobs[prompt].abs().min() > 0  # the unscored pass fills the prompt
    assert scored_rows == int(mask.sum()) < all_rows / 2
    assert train_rows == scored_rows


class PeakWorkingBytes(TorchDispatchMode):
    """The most bytes held at once by the tensors of at least ``least`` bytes that ops make while the mode is on
    (each counted until it is freed; a view or an op's result written into its input is not counted again)."""

    def __init__(self, least: int):
        super().__init__()
        self.least, self.live, self.peak = least, 0, 0

    def _freed(self, nbytes: int) -> None:
        self.live -= nbytes

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        import weakref

        from torch.utils._pytree import tree_flatten

        out = func(*args, **(kwargs or {}))
        tensors = [a for a in tree_flatten((args, kwargs))[0] if isinstance(a, torch.Tensor)]
        inputs = {a.untyped_storage().data_ptr() for a in tensors}
        for t in out if isinstance(out, (tuple, list)) else [out]:
            if (isinstance(t, torch.Tensor) and not t._is_view() and t.untyped_storage().data_ptr() not in inputs
                    and t.untyped_storage().nbytes() >= self.least):
                self.live += t.untyped_storage().nbytes()
                self.peak = max(self.peak, self.live)
                weakref.finalize(t, self._freed, t.untyped_storage().nbytes())
        return out


@pytest.mark.parametrize("with_entropy", [True, False])
def test_the_fused_head_holds_at_most_two_chunks_at_once(with_entropy):
    """The forward holds a chunk's logits and their exponentials (the entropy's product written into the latter),
    backward one slice's softmax gradient: never the three chunk-sized tensors out-of-place arithmetic makes (at the
    Qwen3-0.6B shape with 64 MiB chunks, 64 MB more at the train step's peak RSS; docs/measurements.md)."""
    from rlkit.policy.megatron import parallel

    parallel.init_parallel(parallel.ParallelLayout(), seed=0)
    try:
        n, h, vocab = 480, 16, 4000  # tokens, hidden, vocabulary: a chunk of logits is far larger than the rows
        chunk = 8 * 4 * vocab  # 8 tokens' fp32 logits in the forward; backward: 66 of the vocabulary's rows
        hidden = torch.randn(n // 4, 4, h, requires_grad=True)
        weight = torch.randn(vocab, h)  # frozen (no [V, h] gradient), as an adapted model's head
        ids = torch.randint(0, vocab, (4, n // 4))
        with PeakWorkingBytes(least=chunk // 4) as forward:
            logprobs, _ = head.head_scores(hidden, weight, ids, 1.0, False, with_entropy, chunk)
        with PeakWorkingBytes(least=chunk // 4) as backward:
            logprobs.sum().backward()
    finally:
        parallel.destroy_parallel()
        parallel.release_process_group()
    assert hidden.grad.abs().sum() > 0
    assert forward.peak >= 2 * 8 * 4 * vocab  # (the bound below can fail: two chunks are seen)
    assert forward.peak <= 2.5 * chunk and backward.peak <= 2.5 * chunk, (forward.peak / chunk, backward.peak / chunk)
