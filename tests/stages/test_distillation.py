"""On-policy distillation on the nano task: the teacher's per-token advantages are tinker-cookbook's negative reverse
KL (and its k3 and discounted forms); the teacher's logprobs of the student's tokens equal a direct float64
transformers forward of the teacher folder within 1e-5 (Megatron and DTensor, full weights and adapters); a teacher
with another tokenizer is refused before its weights load; configure() loads and releases the teacher; and
distilling moves the student toward the teacher (its reverse KL to the teacher falls)."""

import pytest
import torch

import rlkit
from rlkit.algorithms import DistillationParams, teacher_advantages
from rlkit.config.loading import load_config
from rlkit.errors import ConfigError, ModelError, StageOrderError

NANO = {"policy.model_preset": "nano", "data.digits": 1, "data.num_train": 200, "data.num_validation": 16,
        "eval.num_prompts": 16, "sft.enabled": False, "policy.max_total_sequence_length": 28,
        "policy.generation.max_new_tokens": 8, "grpo.num_prompts_per_step": 4, "grpo.num_generations_per_prompt": 4,
        "grpo.use_dynamic_sampling": False}


def overrides(tmp_path, teacher, **extra):
    return {**NANO, "policy.model_name": str(tmp_path / "model"), "logger.log_dir": str(tmp_path / "runs"),
            "distillation.enabled": True, "distillation.teacher_model_name": str(teacher), **extra}


def test_teacher_advantages_are_the_negative_reverse_kl():
    torch.manual_seed(0)
    student, teacher = -torch.rand(3, 7) * 3, -torch.rand(3, 7) * 3
    mask = torch.tensor([[0, 0, 1, 1, 1, 0, 0], [0, 1, 1, 1, 1, 1, 1], [0, 0, 0, 1, 0, 0, 0]], dtype=torch.bool)
    student, teacher = student * mask, teacher * mask
    k1 = teacher_advantages(student, teacher, mask, DistillationParams(kl_coef=0.5))
    assert torch.allclose(k1, -0.5 * (student - teacher) * mask, atol=1e-7)  # tinker-cookbook: -coef * (log p - log q)
    k3 = teacher_advantages(student, teacher, mask, DistillationParams(kl_estimator="k3"))
    r = teacher - student
    assert torch.allclose(k3, -(torch.exp(r) - 1 - r) * mask, atol=1e-6) and (k3 <= 0).all()
    discounted = teacher_advantages(student, teacher, mask, DistillationParams(discount=0.9))
    expected = torch.zeros_like(k1)
    for i in range(3):  # each token: its own KL advantage plus the later tokens' discounted (no holes here)
        positions = mask[i].nonzero().flatten().tolist()
        for a, p in enumerate(positions):
            expected[i, p] = sum(0.9 ** (b - a) * -(student[i, q] - teacher[i, q]) for b, q in enumerate(positions)
                                 if b >= a)
    assert torch.allclose(discounted, expected, atol=1e-6)


def test_the_config_names_what_distillation_needs():
    with pytest.raises(ConfigError, match="needs distillation.teacher_model_name"):
        load_config("quickstart_nano", {"distillation.enabled": True})
    with pytest.raises(ConfigError, match="teacher's per-token advantages replace GAE"):
        load_config("ppo", {"distillation.enabled": True, "distillation.teacher_model_name": "t"})


def direct_teacher_logprobs(folder, batch, temperature):
    """The teacher folder's logprobs [B, T] of the batch's tokens by transformers itself, in float64."""
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(str(folder), dtype=torch.float64).eval()
    with torch.no_grad():
        logits = model(input_ids=batch.input_ids, attention_mask=batch.attention_mask.long()).logits / temperature
    out = torch.zeros(batch.input_ids.shape, dtype=torch.float64)
    out[:, 1:] = torch.log_softmax(logits[:, :-1], -1).gather(-1, batch.input_ids[:, 1:, None])[..., 0]
    return out * batch.loss_mask


@pytest.mark.parametrize("backend,lora", [("megatron", False), ("megatron", True), ("dtensor", False)],
                         ids=["megatron", "megatron-lora", "dtensor"])
def test_teacher_logprobs_equal_a_direct_teacher_forward_and_become_the_advantages(tmp_path, model_factory, backend,
                                                                                    lora):
    teacher = model_factory("nano", "llama", seed=7)
    extra = {"policy.backend": backend, "policy.lora_cfg.enabled": lora, "policy.lora_cfg.dim": 4,
             "distillation.kl_coef": 0.5, "distillation.reward_weight": 0.5, "policy.generation.temperature": 0.8}
    with rlkit.Session.from_config("quickstart_nano", overrides(tmp_path, teacher, **extra)) as s:
        batch = s.logprobs(s.score(s.rollout()))
        with pytest.raises(StageOrderError, match=r"no teacher_logprobs yet: run teacher_logprobs\(\)"):
            s.advantages(batch)
        batch = s.teacher_logprobs(batch)
        mask = batch.loss_mask
        direct = direct_teacher_logprobs(teacher, batch, 0.8)
        assert (batch.teacher_logprobs.double() - direct)[mask].abs().max() < 1e-5
        assert not batch.teacher_logprobs[~mask].any()
        kl = (batch.generator_logprobs - batch.teacher_logprobs)[mask]
        assert batch.info["distillation/teacher_kl"] == pytest.approx(float(kl.mean()), abs=1e-6) and kl.abs().max() > 0
        batch = s.advantages(batch)
        env = rlkit.algorithms.compute_advantages("grpo", batch.rewards, mask, batch.group_size,
                                                   s.config.grpo.advantage_params())
        expected = 0.5 * env + teacher_advantages(batch.generator_logprobs, batch.teacher_logprobs, mask,
                                                  s.config.distillation.params())
        assert torch.allclose(batch.advantages, expected, atol=1e-6)
        assert "teacher - " not in repr(batch.show(color="teacher", rows=2)) and "student - teacher logprob" in \
            repr(batch.show(color="teacher", rows=2))
        teacher_weights = {k: v.clone() for k, v in s.components.teacher.hf_state_dict().items()}
        s.train(batch)
        step = s.step()  # the loop: teacher logprobs before advantages
        assert step.values["distillation/teacher_kl"] != 0 and step.values["timing/teacher_logprobs"] > 0
        after = s.components.teacher.hf_state_dict()
        assert all(torch.equal(after[k], v) for k, v in teacher_weights.items())  # frozen
        assert s.components.teacher.version == 0 and s.policy.version == 2


def test_a_teacher_with_another_tokenizer_is_refused_before_its_weights_load(tmp_path, model_factory, monkeypatch):
    from rlkit.policy import teacher as teacher_module

    bpe = model_factory("nano", "llama", seed=7, tokenizer="bpe")
    student = model_factory("nano", "llama", seed=0)

    def loaded(*args, **kwargs):
        raise AssertionError("the teacher's weights were loaded before its tokenizer was checked")

    monkeypatch.setattr(teacher_module, "in_process_policy", loaded)
    from rlkit.config.components import PolicyConfig

    with pytest.raises(ModelError, match=r"its tokenizer differs from the student's .*teacher scores the student's "
                                         r"token ids"):
        teacher_module.build_teacher(PolicyConfig(model_name=str(student)), bpe)
    with pytest.raises(ModelError, match=r"no model folder there .*Train or make the teacher first"):
        teacher_module.build_teacher(PolicyConfig(model_name=str(student)), tmp_path / "not-made-yet")


def test_configure_loads_and_releases_the_teacher(tmp_path, model_factory):
    teacher, bpe = model_factory("nano", "llama", seed=7), model_factory("nano", "llama", seed=7, tokenizer="bpe")
    config = {**NANO, "policy.model_name": str(tmp_path / "model"), "logger.log_dir": str(tmp_path / "runs")}
    with rlkit.Session.from_config("quickstart_nano", config) as s:
        s.step()
        assert s.components.teacher is None
        s.configure(["distillation.enabled=true", f"distillation.teacher_model_name={teacher}"])
        assert s.components.teacher is not None
        assert "distillation/teacher_kl" in s.step().values
        before = s.config
        with pytest.raises(ModelError, match="tokenizer differs"):
            s.configure([f"distillation.teacher_model_name={bpe}"])
        assert s.config is before and s.components.teacher is not None  # nothing lost
        s.configure(["distillation.enabled=false"])
        assert s.components.teacher is None and "distillation/teacher_kl" not in s.step().values


def test_distilling_moves_the_student_toward_the_teacher(tmp_path, model_factory):
    """The teacher: the nano model after an SFT warm start; the student: the fresh nano model. Pure distillation
    (no reward) for 12 steps lowers the student's reverse KL to the teacher on its own samples by a third."""
    teacher_dir = tmp_path / "teacher"
    warm = {**NANO, "policy.model_name": str(tmp_path / "model"), "logger.log_dir": str(tmp_path / "runs"),
            "sft.enabled": True, "sft.num_steps": 60, "sft.batch_size": 32}
    with rlkit.Session.from_config("quickstart_nano", warm) as s:
        s.sft(progress=False)
        s.export_hf(teacher_dir)
    student = {**overrides(tmp_path, teacher_dir), "policy.model_name": str(tmp_path / "student"),
               "seed": 1, "policy.optimizer.lr": 3e-3, "grpo.num_prompts_per_step": 8}
    with rlkit.Session.from_config("quickstart_nano", student) as s:
        kls = [m["distillation/teacher_kl"] for m in s.run(12, progress=False)]
    first, last = sum(kls[:3]) / 3, sum(kls[-3:]) / 3
    assert last < 0.75 * first, kls  # measured: 1.85 -> 1.23 (a student that does not learn stays within ~5%)
