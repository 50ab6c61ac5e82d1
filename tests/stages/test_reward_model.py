"""A reward model from preference pairs (nano quickstart): it learns its pairs, the environment that loads the saved
folder scores a response exactly as training scored it, and a GRPO step runs on its rewards."""

import torch

import rlkit
from rlkit.envs import RewardModelEnvironment
from rlkit.stages.reward_model import pair_scores


def test_a_reward_model_from_the_tasks_pairs_drives_a_grpo_step(tmp_path):
    overrides = {"policy.model_name": str(tmp_path / "model"), "logger.log_dir": str(tmp_path / "runs"),
                 "reward_model.num_steps": 250, "reward_model.lr": 3e-4}
    with rlkit.Session.from_config("quickstart_nano", overrides) as s:
        s.sft(120, progress=False)
        before = {n: p.detach().clone() for n, p in s.policy.model.named_parameters()}
        result = s.train_reward_model(tmp_path / "rm", progress=False)
        assert all(torch.equal(p, before[n]) for n, p in s.policy.model.named_parameters())  # policy untouched
        rows = s.dataset["validation"]
    assert sum(result.accuracies[-20:]) / 20 > 0.8 and result.losses[-1] < result.losses[0]
    assert result.eval_accuracy is not None and 0.0 <= result.eval_accuracy <= 1.0

    env = RewardModelEnvironment(tmp_path / "rm", batch_size=3)
    pair = {"prompt": rows[0]["prompt"], "chosen": rows[0]["answer"], "rejected": str(int(rows[0]["answer"]) + 1)}
    with torch.no_grad():
        chosen, rejected = pair_scores(env.model, env.tokenizer, [pair], None, None)
    scored = env.step([[{"role": "user", "content": pair["prompt"]}, {"role": "assistant", "content": r}]
                       for r in (pair["chosen"], pair["rejected"])], [rows[0], rows[0]])
    assert abs(scored.rewards[0] - chosen.item()) < 1e-5 and abs(scored.rewards[1] - rejected.item()) < 1e-5

    with rlkit.Session.from_config("quickstart_nano", overrides, env=env) as s:
        metrics = s.step()
    assert "rollout/reward_mean" in metrics.values and metrics.values["rollout/reward_mean"] != 0.0
