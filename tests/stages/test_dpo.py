"""DPO as a stage: the per-token weights give the pair loss's gradient whatever the microbatches (Megatron and
DTensor, full weights and adapters, fp32, 1e-6), and ``Session.dpo`` on the nano quickstart fits its pairs, keeps its reference across calls and refuses a
file without pair columns."""

import json

import pytest
import torch

import rlkit
from rlkit.algorithms.preference import dpo_token_weights, preference_loss, sequence_logprobs
from rlkit.config.components import PolicyConfig
from rlkit.data.preference import pairs_from_batch
from rlkit.errors import DataError
from rlkit.policy.backends import in_process_policy
from rlkit.stages.dpo import weighted_logprob_loss
from tests.helpers import random_batch

BETA = 0.5


def grads_of(policy):
    return {n: (p.grad.full_tensor() if hasattr(p.grad, "full_tensor") else p.grad).clone()
            for n, p in policy.model.named_parameters() if p.requires_grad}


def direct_dpo_loss(logprobs, batch, counts):
    """The pair loss itself, from one microbatch holding every row (chosen rows first)."""
    seq, ref = sequence_logprobs(logprobs, batch.loss_mask, False), sequence_logprobs(batch.ref_logprobs,
                                                                                      batch.loss_mask, False)
    n = seq.shape[0] // 2
    loss = preference_loss(seq[:n], seq[n:], ref[:n], ref[n:], beta=BETA).losses.mean()
    return loss, {"loss": loss.detach()}


@pytest.mark.parametrize("backend,lora", [("megatron", False), ("megatron", True), ("dtensor", False),
                                          ("dtensor", True)])
def test_the_weighted_loss_has_the_dpo_gradient_in_any_microbatches(model_factory, backend, lora):
    path = str(model_factory("nano", "qwen3", seed=5))
    batch = random_batch(b=8, t=20, seed=3)
    found = {}
    for micro in (8, 1, 3):
        policy = in_process_policy(PolicyConfig(model_name=path, train_micro_batch_size=micro, backend=backend,
                                                lora_cfg={"enabled": lora, "dim": 4}))
        try:
            ref = policy.logprobs(batch.input_ids, batch.attention_mask, scored=batch.loss_mask).logprobs
            # weights moved from the reference's (the same on every backend), so the margins are not 0
            policy.load_hf_state({name: t + torch.randn(t.shape, generator=torch.Generator().manual_seed(t.numel()))
                                  * 0.01 for group in policy.export_hf_groups() for name, t in group})
            if micro == 8:
                policy.compute_gradients(batch.with_(ref_logprobs=ref), direct_dpo_loss)
                found["direct"] = grads_of(policy)
            current = policy.logprobs(batch.input_ids, batch.attention_mask, scored=batch.loss_mask).logprobs
            weights, pairs = dpo_token_weights(current, ref, batch.loss_mask, beta=BETA)
            assert (pairs.chosen_rewards - pairs.rejected_rewards).abs().min() > 1e-4
            policy.compute_gradients(batch.with_(advantages=weights), weighted_logprob_loss)
            found[micro] = grads_of(policy)
        finally:
            policy.close()
    for micro in (8, 1, 3):
        for name, grad in found["direct"].items():
            assert torch.allclose(found[micro][name], grad, atol=1e-6, rtol=1e-5), (micro, name)
    assert max(g.abs().max() for g in found["direct"].values()) > 1e-4  # a gradient that is not ~0


def test_session_dpo_fits_its_pairs_and_keeps_its_reference(tmp_path):
    overrides = {"policy.model_name": str(tmp_path / "model"), "logger.log_dir": str(tmp_path / "runs"),
                 "dpo.lr": 1e-4, "dpo.batch_size": 16}
    with rlkit.Session.from_config("quickstart_nano", overrides) as s:
        s.sft(60, progress=False)
        first = s.dpo(30, progress=False)
        assert first.steps[0]["rewards/margins"] == 0.0  # the reference is the policy as DPO starts
        late = first.steps[-10:]
        assert sum(m["rewards/accuracies"] for m in late) / 10 > 0.7
        assert sum(m["loss"] for m in late) / 10 < 0.68  # from log 2 = 0.693
        again = s.dpo(5, progress=False)  # continues: same reference, so the margins start where they were
        assert again.steps[0]["rewards/margins"] > 0.0
        assert s.run_state.preference.steps == 35 and s.last_dpo is again
        assert not s.stale  # refit at the end, as sft()
        own = pairs_from_batch(s.score(s.rollout(s.sampler.next_batch(16))))  # the policy's own mistakes
        assert own and s.dpo(3, progress=False, pairs=own).steps[0]["rewards/margins"] != 0.0  # same reference
        assert s.run_state.preference.steps == 38 and s.run_state.preference.sampler.dataset == own
        with pytest.raises(ValueError, match="no pairs"):
            s.dpo(1, progress=False, pairs=[])


def test_pairs_from_a_scored_batch_reject_the_most_frequent_mistake():
    rows = ({"prompt": "2+2", "answer": "4"}, {"prompt": "1+1", "answer": "2"}, {"prompt": "3+3", "answer": "6"})
    completions = ("5", "4", "5", "3",  # one right: chosen; "5" twice: rejected
                   "3", "3", "1", "3",  # none right: the answer is chosen
                   "6", "6", "6", "6")  # all right: no pair
    batch = random_batch(b=12, t=8, group_size=4).with_(
        rows=rows, completions=completions,
        rewards=torch.tensor([0.0, 1.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 1.0, 1.0, 1.0, 1.0]))
    assert pairs_from_batch(batch) == [{"prompt": "2+2", "chosen": "4", "rejected": "5"},
                                       {"prompt": "1+1", "chosen": "2", "rejected": "3"}]
    with pytest.raises(ValueError, match="scored batch"):
        pairs_from_batch(batch.with_(rewards=None))


def test_a_file_without_pair_columns_is_refused(tmp_path):
    bad = tmp_path / "pairs.jsonl"
    bad.write_text(json.dumps({"prompt": "1+1", "answer": "2"}) + "\n")
    overrides = {"policy.model_name": str(tmp_path / "model"), "logger.log_dir": str(tmp_path / "runs"),
                 "dpo.train_file": str(bad)}
    with rlkit.Session.from_config("quickstart_nano", overrides) as s:
        with pytest.raises(DataError, match="'chosen', 'rejected'"):
            s.dpo(1, progress=False)


def test_label_smoothing_without_the_robust_loss_is_a_config_error():
    from rlkit.config.loading import load_config
    from rlkit.errors import ConfigError

    with pytest.raises(ConfigError, match="dpo.loss_type=robust"):
        load_config("quickstart_nano", {"dpo.label_smoothing": 0.1})
    assert load_config("quickstart_nano", {"dpo.label_smoothing": 0.1, "dpo.loss_type": "robust"}).dpo.loss_type == "robust"
