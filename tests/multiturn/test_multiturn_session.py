"""Multi-turn conversations through a real session (Megatron-Core policy, vLLM generator): the rollout source
plays them, logprobs agree across turns after a refit, dynamic sampling and async GRPO carry them whole."""

import pytest
import torch

import rlkit
from rlkit.envs import Environment, EnvReturn
from tests.session.conftest import tiny_overrides


class KeepTalking(Environment):
    """Answers every turn with "ok" until the third; each turn's reward is a tenth of its length, so the rewards
    of an untrained model's conversations differ within a group."""

    name, max_turns = "keep-talking", 3

    def step(self, conversations, rows):
        turns = [sum(m["role"] == "assistant" for m in c) for c in conversations]
        rewards = torch.tensor([0.1 * len(c[-1]["content"]) for c in conversations], dtype=torch.float32)
        done = torch.tensor([t >= 3 for t in turns])
        observations = [None if d else {"role": "user", "content": "ok"} for d in done.tolist()]
        return EnvReturn(rewards, done, observations, [{"turn": t} for t in turns], [])


def overrides(tmp_path, **extra):
    return tiny_overrides(tmp_path, **{"data.digits": 1, "data.num_train": 100, "data.num_validation": 8,
                                       "eval.num_prompts": 8, "policy.max_total_sequence_length": 48,
                                       "policy.generation.max_new_tokens": 6, **extra})


def has_holes(mask: torch.Tensor) -> bool:
    """Some row has a masked-out token between two masked-in ones."""
    starts = (mask[:, 1:] & ~mask[:, :-1]).sum(1)
    return bool((starts >= 2).any())


@pytest.fixture(scope="module")
def session(tmp_path_factory):
    s = rlkit.Session.from_config("quickstart", overrides(tmp_path_factory.mktemp("multiturn")), env=KeepTalking())
    yield s
    s.close()


def test_vllm_and_policy_logprobs_agree_across_turns_after_a_refit(session):
    session.step()  # an optimizer step and a refit: the generator holds new weights
    assert session.policy.version == 1 and not session.stale
    batch = session.logprobs(session.rollout())
    assert batch.rewards is not None and batch.turn_rewards is not None
    assert max(m["turns"] for m in batch.env_metadata) == 3 and has_holes(batch.loss_mask)
    diff = (batch.generator_logprobs - batch.prev_logprobs).abs()[batch.loss_mask]
    assert diff.max() <= 1e-3 and diff.mean() <= 1e-4, (diff.max().item(), diff.mean().item())
    # environment tokens carry no logprob and no advantage
    batch = session.advantages(batch)
    outside = batch.attention_mask & ~batch.loss_mask
    assert (batch.generator_logprobs[outside] == 0).all() and (batch.advantages[outside] == 0).all()


def test_a_step_reports_turns_and_evaluation_plays_conversations(session):
    metrics = session.step()
    assert metrics["rollout/turns_mean"] > 1
    assert metrics["rollout/gen_length_mean"] <= 3 * 6  # generated tokens only, environment tokens not counted
    result = session.evaluate()
    assert result.num_prompts == 8 and max(m["turns"] for m in result.batch.env_metadata) > 1


def test_dynamic_sampling_keeps_whole_conversations(session):
    session.configure(["grpo.use_dynamic_sampling=true", "grpo.dynamic_sampling_max_gen_batches=2"])
    try:
        batch = session.rollout()
        g = batch.group_size
        assert batch.info["dynamic_sampling/tries"] >= 1
        rewards = batch.rewards.view(-1, g)
        assert (rewards.std(dim=1) > 0).all()  # kept groups vary
        assert torch.allclose(batch.rewards, batch.turn_rewards.sum(1))
        session.step()
    finally:
        session.configure(["grpo.use_dynamic_sampling=false"])


def test_async_grpo_producer_plays_whole_conversations(tmp_path):
    with rlkit.Session.from_config("quickstart", overrides(tmp_path, **{"grpo.async_grpo.enabled": True,
                                                                  "loss_fn.off_policy_correction": "tis"}),
                                   env=KeepTalking()) as s:
        history = s.run(3, progress=False)
        assert all(m["rollout/turns_mean"] > 1 for m in history)
        batch = s.batch
        assert batch.turn_rewards is not None and has_holes(batch.loss_mask)
        assert all(m["timing/rollout"] > 0 for m in history)  # the step clock's: the wait for the batch
