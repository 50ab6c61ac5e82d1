"""The memory plan's lines for PPO's critic, DPO's reference and reward-model training against what the built models
allocate (nano models, fp32): weights, gradients and AdamW's moments after a step, and the reference's copy, byte for
byte; each plan line is that plus the step's temporaries and the activations it states."""

import pytest
import torch

from rlkit.config.loading import load_config
from rlkit.memory.offline import plan_offline_stage
from rlkit.memory.plan import GIB, Device, ModelShape, activation_bytes, plan_memory
from rlkit.memory.value_models import value_model_parameters
from rlkit.models import read_hf_config
from tests.helpers import random_batch

CPU = Device("cpu", 100 * GIB, "test CPU")


@pytest.fixture(scope="module")
def folder(model_factory):
    return str(model_factory("nano", "qwen2", seed=1))  # untied: the LM head the value model does not have


def config(folder, *more):
    return load_config("ppo", [f"policy.model_name={folder}", "policy.model_preset=null", "critic.micro_batch_size=3",
                               "policy.max_total_sequence_length=16", *more])


def allocated(named_params, optimizer) -> int:
    """Bytes of the weights, their gradients and AdamW's two moments."""
    total = sum(p.numel() * p.element_size() + p.grad.numel() * p.grad.element_size() for _, p in named_params)
    return total + sum(s[k].numel() * s[k].element_size() for s in optimizer.state.values()
                       for k in ("exp_avg", "exp_avg_sq"))


def shape_of(folder) -> ModelShape:
    return ModelShape.of(read_hf_config(folder, check_weights=False))


@pytest.mark.parametrize("backend", ["transformers", "policy"])
def test_the_critic_line_is_what_the_critic_allocates(folder, backend):
    from rlkit.policy.critic import Critic

    cfg = config(folder, f"critic.backend={backend}")
    critic = Critic(folder, cfg.critic, seed=0, policy=cfg.policy)
    measured = []
    step = critic.optimizer.step

    def step_and_measure():  # at the step's end: gradients still held, AdamW's moments made
        step()
        measured.append(allocated(critic.value_model.named_trained_parameters(), critic.optimizer))

    critic.optimizer.step = step_and_measure
    try:
        batch = random_batch(b=4, t=12)
        values = critic.values(batch.input_ids, batch.attention_mask, batch.loss_mask)
        critic.train_step(batch.input_ids, batch.attention_mask, batch.loss_mask, values, values + 1)
        (measured,) = measured
    finally:
        critic.close()
    shape = shape_of(folder)
    n = value_model_parameters(shape.parameters, shape.vocab, shape.hidden, shape.tied, bias=True)
    assert n < shape.parameters and measured == 16 * n  # weights, gradients, two moments: fp32
    activations = activation_bytes(shape, cfg, 3, shape.layers, 1, 4, CPU)
    assert plan_memory(cfg, device=CPU).parts["critic"] == 20 * n + activations  # + the step's temporaries


def test_the_dpo_reference_line_is_the_reference_the_policy_holds(folder):
    from rlkit.policy.backends import in_process_policy

    cfg = config(folder, "critic.enabled=false", "grpo.advantage_estimator=grpo")
    assert plan_memory(cfg, device=CPU).parts["reference"] == 0  # the RL loss reads none
    plan = plan_offline_stage(cfg, "dpo", device=CPU)
    policy = in_process_policy(cfg.policy)
    try:
        policy.set_reference_to_current()
        policy.keep_reference(True)  # what the DPO stage does
        held = sum(t.numel() * t.element_size() for t in policy.reference.tensors.values())
    finally:
        policy.close()
    assert held == plan.parts["reference"] == 4 * shape_of(folder).parameters
    lora = plan_offline_stage(config(folder, "critic.enabled=false", "grpo.advantage_estimator=grpo",
                                     "policy.lora_cfg.enabled=true"), "dpo", device=CPU)
    assert lora.parts["reference"] == 0  # the base with adapters off


@pytest.mark.parametrize("backend", ["transformers", "policy"])
def test_the_reward_model_line_is_what_reward_model_training_allocates(folder, backend):
    from rlkit.config.run import RewardModelConfig
    from rlkit.policy.value_model import build_value_model
    from rlkit.stages.reward_model import reward_model_step, reward_model_tokenizer

    cfg = config(folder, "critic.enabled=false", "grpo.advantage_estimator=grpo", f"reward_model.backend={backend}",
                 "reward_model.batch_size=2", "reward_model.max_length=12")
    model = build_value_model(backend, folder, bias=False, policy=cfg.policy)
    try:
        optimizer = torch.optim.AdamW([p for _, p in model.named_trained_parameters()], lr=1e-3)
        pairs = [{"prompt": "1+2=", "chosen": "3", "rejected": "4"}, {"prompt": "2+2=", "chosen": "4", "rejected": "5"}]
        reward_model_step(model, optimizer, reward_model_tokenizer(folder), pairs, RewardModelConfig(), None)
        measured = allocated(model.named_trained_parameters(), optimizer)
    finally:
        model.close()
    shape = shape_of(folder)
    n = value_model_parameters(shape.parameters, shape.vocab, shape.hidden, shape.tied, bias=False)
    assert measured == 16 * n
    plan = plan_offline_stage(cfg, "reward_model", device=CPU)
    sized = cfg.model_copy(update={"policy": cfg.policy.model_copy(update={"max_total_sequence_length": 12})})
    assert plan.parts["reward model"] == 20 * n + activation_bytes(shape, sized, 4, shape.layers, 1, 4, CPU)
    assert "reward model" in plan.table() and plan.parts["weights"] == plan_memory(cfg, device=CPU).parts["weights"]
