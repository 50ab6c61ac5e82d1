"""The memory plan of the offline stages that hold a second model beside the policy: DPO (``Session.dpo``,
``rlkit dpo``) and reward-model training (``Session.train_reward_model``).

Each is the run's plan (:func:`rlkit.memory.plan.plan_memory`: the policy, its engine, what the RL config adds) with
the stage's own line:

- DPO's reference: the policy's weights as DPO starts, a copy of every weight in the masters' dtype, this device's
  shard (none with adapters: the base with them off is the reference). It replaces the RL loss's reference line (one
  copy serves both: :class:`rlkit.policy.reference.Reference`).
- the reward model: a value model (:mod:`rlkit.memory.value_models`, no head bias) trained in fp32 with AdamW on
  ``reward_model.backend``, and its activations for a step's ``2 x reward_model.batch_size`` texts at the policy's
  sequence length (``reward_model.max_length`` where set). Its base folder is the policy's model (counted at its
  shape).

Deliberate simplifications: the DPO step's activations and logits are the RL step's (the same micro batch and
length);
the reward model's texts are counted at full length.
"""

from __future__ import annotations

from typing import Any, Literal, Mapping, Optional

from rlkit.config.run import RunConfig
from rlkit.memory.plan import Device, MemoryPlan, ModelShape, activation_bytes, plan_memory, value_model_shard
from rlkit.memory.value_models import value_model_bytes, value_model_parameters
from rlkit.units import count_text

OfflineStage = Literal["dpo", "reward_model"]


def dpo_reference_bytes(config: RunConfig, shape: ModelShape) -> int:
    """The bytes of DPO's reference on this device (0 with adapters)."""
    p = config.policy
    if p.lora_cfg.enabled:
        return 0
    return shape.parameters * (2 if p.pure_bf16 else 4) // p.backend_section.weight_shards(p.num_workers)


def plan_offline_stage(config: RunConfig, stage: OfflineStage, hf_config: Optional[Mapping[str, Any]] = None,
                       device: Optional[Device] = None) -> MemoryPlan:
    """The plan of ``config`` while ``stage`` runs (see the module docstring)."""
    if hf_config is None:
        from rlkit.models import read_hf_config

        hf_config = read_hf_config(config.policy.model_name, check_weights=False)
    plan = plan_memory(config, hf_config, device)
    shape = ModelShape.of(hf_config)
    parts, reasons = dict(plan.parts), dict(plan.reasons)
    if stage == "dpo":
        parts["reference"] = dpo_reference_bytes(config, shape)
        reasons["reference"] = ("DPO's reference: a copy of the weights as DPO starts" if parts["reference"] else
                                "none: DPO's reference is the base with adapters off")
    elif stage == "reward_model":
        rm = config.reward_model
        shard = value_model_shard(config, rm.on_policy_backend)
        n = value_model_parameters(shape.parameters, shape.vocab, shape.hidden, shape.tied, bias=False)
        length = rm.max_length or config.policy.max_total_sequence_length
        sized = config.model_copy(update={"policy": config.policy.model_copy(
            update={"max_total_sequence_length": length})})
        activations = activation_bytes(shape, sized, 2 * rm.batch_size, shape.layers, shard, 4, plan.device)
        parts["reward model"] = value_model_bytes(n, shard, activations).total
        reasons["reward model"] = (f"{count_text(n)} parameters x 20 B (fp32 weights, gradients, AdamW's moments and "
                                   f"temporaries){f' / {shard}' if shard > 1 else ''} + activations of "
                                   f"{2 * rm.batch_size} texts x {length} tokens")
    else:
        raise ValueError(f"unknown offline stage {stage!r}; choose 'dpo' or 'reward_model'")
    return MemoryPlan(parts, reasons, plan.device, plan.devices)
