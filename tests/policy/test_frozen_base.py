"""``policy.lora_cfg.release_base_while_generating``: under adapters the frozen base leaves memory after a refit and
comes back from the model folder, exactly, at the next forward pass, export or HF import."""

import pytest
import torch

from rlkit.errors import ConfigError
from rlkit.policy.backends import in_process_policy
from tests.helpers import pg_token_mean_loss, random_batch
from tests.policy.test_lora import lora_cfg


def resident_bytes(policy) -> int:
    """Bytes of the distinct storages behind the policy's parameters."""
    storages = {p.untyped_storage().data_ptr(): p.untyped_storage().nbytes() for p in policy.model.parameters()}
    return sum(storages.values())


@pytest.mark.parametrize("precision", ["float32", "bfloat16"])  # (at bf16 the base is the compute copy, shared)
def test_a_released_base_comes_back_exactly(model_factory, precision):
    path = model_factory("nano", "qwen3", seed=2, tie_word_embeddings=True)  # the tied table: one storage, twice
    batch = random_batch(b=6, t=20)
    twins = [in_process_policy(lora_cfg(path, "megatron", precision, release_base_while_generating=True))
             for _ in range(2)]
    kept, released = twins
    try:
        for policy in twins:
            policy.train_step(batch, pg_token_mean_loss)
        base = sum(p.numel() * p.element_size() for p in released.model.parameters() if not p.requires_grad)
        before = resident_bytes(released)
        assert released.release_frozen_base() == base and resident_bytes(released) == before - base
        assert released.release_frozen_base() == 0  # (already released)
        # the next forward pass reads it back: the same scores, the same step, the same merged export
        scores = [p.logprobs(batch.input_ids, batch.attention_mask).logprobs for p in twins]
        assert torch.equal(scores[0], scores[1]) and resident_bytes(released) == before
        released.release_frozen_base()
        steps = [p.train_step(batch, pg_token_mean_loss) for p in twins]
        assert steps[0].metrics == steps[1].metrics and steps[0].grad_norm == steps[1].grad_norm
        # an export of a released base (a refit's) reads it back a layer at a time, and leaves it released
        released.release_frozen_base()
        base_groups = released.adapter.frozen_base.keys()
        exported = [{}, kept.hf_state_dict()]
        for group in released.export_hf_groups():
            exported[0].update((name, t.clone()) for name, t in group)
            assert len(base_groups) - len(released.adapter.frozen_base.released) <= 2  # one layer, and the ends
        assert released.adapter.frozen_base.released == set(base_groups) and resident_bytes(released) == before - base
        assert exported[0].keys() == exported[1].keys()
        assert all(torch.equal(exported[0][k], exported[1][k]) for k in exported[0])
    finally:
        for policy in twins:
            policy.close()


def test_only_adapters_can_release_a_base(model_factory, tmp_path):
    from rlkit.config.components import PolicyConfig
    from rlkit.config.loading import load_config

    policy = in_process_policy(PolicyConfig(model_name=str(model_factory("nano", "qwen2")), train_micro_batch_size=4))
    try:
        with pytest.raises(ValueError, match="policy.lora_cfg.enabled=true"):
            policy.release_frozen_base()
    finally:
        policy.close()
    with pytest.raises(ConfigError, match="release_base_while_generating: not built for the dtensor backend .*"
                                          "use policy.backend=megatron"):
        load_config("quickstart_nano", [f"policy.model_name={tmp_path}/m", "policy.lora_cfg.enabled=true",
                                        "policy.lora_cfg.release_base_while_generating=true",
                                        "policy.megatron_cfg.enabled=false", "policy.dtensor_cfg.enabled=true"])
