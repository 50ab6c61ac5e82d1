"""The LLM-judge environment (prompt template, score parsing, failures) and weighted reward lists.

The judge here is a scripted batch function (the tests are about the environment around it); the engine-backed
judge is checked against a scripted generator for what it sends to the engine."""

import pytest
import torch

from rlkit.config.loading import load_config
from rlkit.envs.arithmetic import ArithmeticEnvironment
from rlkit.envs.judge import JudgeEnvironment, RewardComponent, WeightedRewards, last_number_score
from rlkit.errors import ConfigError, RewardError
from rlkit.generation.base import Generation
from rlkit.generation.judge import engine_judge
from rlkit.models.bpe import build_bpe_tokenizer
from rlkit.run.metrics import rollout_metrics
from rlkit.stages.score import score
from rlkit.stages.settings import ScoreSettings
from rlkit.trajectories import Trajectories

ROWS = [{"prompt": "2+3", "answer": "5"}, {"prompt": "4+4", "answer": "8"}, {"prompt": "1+1", "answer": "2"}]
COMPLETIONS = ["5", "9", "2"]


def convs(completions=COMPLETIONS):
    return [[{"role": "user", "content": r["prompt"]}, {"role": "assistant", "content": c}] for r, c in zip(ROWS, completions)]


class Judge:
    def __init__(self, replies):
        self.replies, self.asked = replies, []

    def __call__(self, prompts):
        self.asked.append(list(prompts))
        if isinstance(self.replies, Exception):
            raise self.replies
        return self.replies[:len(prompts)]


def test_scores_are_parsed_and_scaled():
    assert last_number_score("I'd say 7") == 0.7
    assert last_number_score("Score: 3/5 -> final 10") == 1.0
    for reply in ("no idea", "11", "-1"):
        with pytest.raises(ValueError):
            last_number_score(reply)


def test_the_judge_fills_the_template_per_sample_in_one_batch_call():
    judge = Judge(["10", "score 2", "ten"])
    env = JudgeEnvironment(judge, "Q: {prompt} A: {completion} ref {answer}. Score 0-10:")
    out = env.step(convs(), ROWS)
    assert judge.asked == [["Q: 2+3 A: 5 ref 5. Score 0-10:", "Q: 4+4 A: 9 ref 8. Score 0-10:",
                            "Q: 1+1 A: 2 ref 2. Score 0-10:"]]
    assert out.rewards.tolist() == pytest.approx([1.0, 0.2, 0.0])
    assert len(out.errors) == 1 and out.errors[0].startswith("sample 2: ValueError: no score")
    assert out.metadata[1]["judge_reply"] == "score 2"


def test_a_missing_placeholder_fails_its_samples_and_a_raising_judge_fails_all():
    out = JudgeEnvironment(Judge(["1"] * 3), "{prompt} {missing}").step(convs(), ROWS)
    assert [e.split(":")[0] for e in out.errors] == ["sample 0", "sample 1", "sample 2"] and "KeyError" in out.errors[0]
    out = JudgeEnvironment(Judge(RuntimeError("judge down")), "{completion}").step(convs(), ROWS)
    assert len(out.errors) == 3 and "judge down" in out.errors[0] and out.rewards.tolist() == [0.0] * 3


def batch(completions=COMPLETIONS):
    n = len(completions)
    return Trajectories(prompts=tuple(r["prompt"] for r in ROWS), completions=tuple(completions),
                        input_ids=torch.ones(n, 4, dtype=torch.long), attention_mask=torch.ones(n, 4, dtype=torch.bool),
                        loss_mask=torch.ones(n, 4, dtype=torch.bool), generator_logprobs=torch.zeros(n, 4),
                        finish_reasons=("stop",) * n, group_size=1, policy_version=0, rows=tuple(ROWS))


def test_a_judge_failing_on_every_sample_is_a_reward_error_even_weighted():
    never = JudgeEnvironment(Judge(["no score"] * 3), "{completion}")
    with pytest.raises(RewardError, match="failed on every sample"):
        score(batch(), never)
    weighted = WeightedRewards([(ArithmeticEnvironment(), 0.8, "exact"), (never, 0.2, "judge")])
    with pytest.raises(RewardError, match="(?s)failed on every sample.*First failure: judge: sample 0"):
        score(batch(), weighted)


def test_weighted_rewards_sum_components_and_log_each():
    def short(prompts, completions, **columns):
        return [1.0 if len(c) == 1 else 0.0 for c in completions]

    env = WeightedRewards([RewardComponent(ArithmeticEnvironment(), 0.5, "exact"),
                           RewardComponent(JudgeEnvironment(Judge(["10", "5", "x"]), "{completion}"), 0.25),
                           RewardComponent(short, 0.25)])
    assert env.name == "exact+judge+short"
    with pytest.warns(UserWarning, match="1 of 3 sample"):
        scored = score(batch(), env, ScoreSettings(max_failure_fraction=0.5))
    assert scored.rewards.tolist() == pytest.approx([0.5 + 0.25 + 0.25, 0.0 + 0.125 + 0.25, 0.5 + 0.0 + 0.25])
    assert scored.reward_errors[0].startswith("judge: sample 2: ValueError")
    metrics = rollout_metrics(scored)
    assert metrics["rollout/reward/exact_mean"] == pytest.approx(2 / 3)
    assert metrics["rollout/reward/judge_mean"] == pytest.approx(0.5)
    assert metrics["rollout/reward/short_mean"] == 1.0
    with pytest.raises(ValueError, match="unique"):
        WeightedRewards([(ArithmeticEnvironment(), 1.0), (ArithmeticEnvironment(), 1.0)])


def test_env_rewards_in_the_config_build_a_weighted_environment(tmp_path, monkeypatch):
    from rlkit.builders import build_environment

    (tmp_path / "my_rewards.py").write_text("def short(prompts, completions, **kw):\n"
                                            "    return [float(len(c) == 1) for c in completions]\n")
    monkeypatch.chdir(tmp_path)
    config = load_config("quickstart", ["env.rewards=[{env: arithmetic, weight: 0.7}, {fn: 'my_rewards:short', "
                                        "weight: 0.3}]"])
    env = build_environment(config)
    assert repr(env) == "WeightedRewards(0.7 x arithmetic, 0.3 x short)"
    assert env.step(convs(), ROWS).rewards.tolist() == pytest.approx([1.0, 0.3, 1.0])
    with pytest.raises(ConfigError, match="env.rewards: .*give exactly one of fn"):
        load_config("quickstart", ["env.rewards=[{weight: 1.0}]"])


def test_engine_judge_renders_each_prompt_and_samples_once_greedily():
    tok = build_bpe_tokenizer()

    class Recording:
        def generate(self, prompt_token_ids, n, sampling):
            self.seen = ([tok.decode(p) for p in prompt_token_ids], n, sampling)
            return Generation.from_samples(prompt_token_ids, [([5], [-0.1], "7", "stop")] * len(prompt_token_ids), n)

    engine = Recording()
    replies = engine_judge(engine, tok, max_new_tokens=4)(["Rate: 5", "Rate: 9"])
    prompts, n, sampling = engine.seen
    assert replies == ["7", "7"] and n == 1 and sampling.temperature == 0.0 and sampling.max_new_tokens == 4
    assert prompts[1] == "<|im_start|>user\nRate: 9<|im_end|>\n<|im_start|>assistant\n"
