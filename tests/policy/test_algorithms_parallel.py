"""DPO and on-policy distillation with the policy in a 2-rank Ray worker group (Megatron TP=2) against one process
(slow: Ray workers).

DPO: one step on the same pairs from the same weights; the pairs' metrics, the gradient norm and the weights after
it agree within 1e-5 (the step moves the weights by far more). Distillation: a session whose student runs in the
TP=2 group and whose teacher runs in this process (one process's layout); the teacher's logprobs equal a direct
float64 transformers forward within 1e-5, and the student's update on the batch's distillation advantages equals
the one-process policy's within 1e-5.
"""

import pytest

from rlkit.config.components import OptimizerConfig, PolicyConfig
from rlkit.config.run import DPOConfig
from rlkit.policy.megatron.policy import MegatronPolicy
from rlkit.stages.dpo import dpo_step
from rlkit.stages.settings import DPOSettings
from tests.helpers import random_batch

ray = pytest.importorskip("ray")
pytestmark = pytest.mark.slow

TOL = 1e-5


def max_diff(a, b):
    return max((a[k] - b[k]).abs().max().item() for k in b)


@pytest.fixture(scope="module")
def model_cfg(model_factory):
    path = model_factory("nano", "qwen2", seed=1, num_key_value_heads=2)  # two KV heads: TP=2 is a valid layout
    return PolicyConfig(model_name=str(path), train_micro_batch_size=3, optimizer=OptimizerConfig(lr=1e-3))


def tp2_group(cfg):
    from rlkit.config.backends import MegatronConfig
    from rlkit.policy.workers import RayPolicyGroup

    return RayPolicyGroup(cfg.model_copy(update={"megatron_cfg": MegatronConfig(tensor_model_parallel_size=2)}),
                          world_size=2, seed=0)


def one_dpo_step(policy, batch, settings):
    """The pairs' metrics of one DPO step from the reference = the starting weights, and the weights after it."""
    try:
        before = policy.hf_state_dict()
        policy.set_reference_to_current()
        metrics = dpo_step(policy, batch, settings)
        return before, metrics, policy.hf_state_dict()
    finally:
        policy.close()


def test_a_dpo_step_under_tensor_parallel_2_matches_one_process(ray_cluster, model_cfg):
    batch = random_batch(b=8, t=24)  # rows 0-3 the chosen responses, 4-7 the rejected ones
    # (at the reference itself the pair loss's gradient is -beta * sigmoid(0) per token, signed: not 0)
    settings = DPOSettings(DPOConfig(beta=0.5, sft_weight=0.3), sft=None)  # dpo_step reads settings.dpo only
    before, ref_metrics, ref_after = one_dpo_step(MegatronPolicy(model_cfg), batch, settings)
    _, metrics, after = one_dpo_step(tp2_group(model_cfg), batch, settings)
    assert set(metrics) == set(ref_metrics)
    for key, value in ref_metrics.items():
        assert abs(metrics[key] - value) < TOL * max(1.0, abs(value)), key
    assert max_diff(ref_after, before) > 100 * TOL  # the step moved the weights measurably
    assert max_diff(after, ref_after) < TOL


def test_distillation_with_the_student_in_a_tensor_parallel_2_group(ray_cluster, model_factory, tmp_path):
    import rlkit
    from rlkit.policy.workers import RayPolicyGroup
    from tests.stages.test_distillation import NANO, direct_teacher_logprobs

    student = model_factory("nano", "qwen2", seed=1, num_key_value_heads=2)
    teacher = model_factory("nano", "qwen2", seed=7, num_key_value_heads=2)
    overrides = {**NANO, "policy.model_name": str(student), "policy.model_preset": None,
                 "logger.log_dir": str(tmp_path / "runs"), "policy.num_workers": 2,
                 "policy.megatron_cfg.tensor_model_parallel_size": 2, "policy.train_micro_batch_size": 4,
                 "policy.optimizer.lr": 1e-3,  # one step must move the weights well past the comparison's tolerance
                 "distillation.enabled": True, "distillation.teacher_model_name": str(teacher)}
    with rlkit.Session.from_config("quickstart_nano", overrides) as s:
        assert isinstance(s.policy, RayPolicyGroup) and not isinstance(s.components.teacher, RayPolicyGroup)
        batch = s.advantages(s.teacher_logprobs(s.logprobs(s.score(s.rollout()))))
        mask = batch.loss_mask
        assert (batch.teacher_logprobs.double() - direct_teacher_logprobs(teacher, batch, 1.0))[mask].abs().max() < TOL
        before = s.policy.hf_state_dict()
        s.train(batch)
        after = s.policy.hf_state_dict()
        assert "distillation/teacher_kl" in s.step().values
        cfg, loss_fn = s.config.policy, s.loss_fn
    # the same batch and advantages in one process, from the same weights
    policy = MegatronPolicy(cfg.model_copy(update={"num_workers": 1, "megatron_cfg": cfg.megatron_cfg.single_process()}))
    try:
        assert max_diff(policy.hf_state_dict(), before) < TOL
        policy.train_step(batch, loss_fn)
        assert max_diff(after, before) > 100 * TOL and max_diff(policy.hf_state_dict(), after) < TOL
    finally:
        policy.close()
