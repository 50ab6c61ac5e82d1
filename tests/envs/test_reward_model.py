"""Reward-model environment: its scores are the transformers model's own forward on the same texts."""

import pytest
import torch
from transformers import LlamaConfig, LlamaForSequenceClassification

from rlkit.envs import RewardModelEnvironment, ScorerEnvironment
from rlkit.envs.reward_model import conversation_text
from rlkit.models.tokenizer import build_char_tokenizer


@pytest.fixture(scope="module")
def reward_model_folder(tmp_path_factory):
    """A tiny random Llama reward model (one output) with the character tokenizer, made offline."""
    tokenizer = build_char_tokenizer()
    config = LlamaConfig(vocab_size=len(tokenizer), hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=128, num_labels=1,
                         pad_token_id=tokenizer.pad_token_id, bos_token_id=tokenizer.bos_token_id,
                         eos_token_id=tokenizer.eos_token_id)
    torch.manual_seed(0)
    folder = tmp_path_factory.mktemp("reward-model")
    LlamaForSequenceClassification(config).save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    return folder


def conversations():
    pairs = [("1+1", "2"), ("12+30", "42"), ("999+1", "1000000"), ("7-9", "-2"), ("5*5", ""), ("hello", "world, at length")]
    return [[{"role": "user", "content": p}, {"role": "assistant", "content": c}] for p, c in pairs]


def test_scores_equal_the_models_own_forward_on_each_text(reward_model_folder):
    env = RewardModelEnvironment(reward_model_folder, batch_size=4)  # two batches, padded to different lengths
    convs = conversations()
    result = env.step(convs, [{}] * len(convs))
    assert result.done.all() and result.num_errors == 0
    model = LlamaForSequenceClassification.from_pretrained(reward_model_folder).eval()
    tokenizer = env.tokenizer
    with torch.no_grad():
        reference = torch.stack([model(torch.tensor([tokenizer(conversation_text(tokenizer, c), add_special_tokens=False)
                                                     ["input_ids"]])).logits[0, 0] for c in convs])  # one text, no padding
    assert torch.allclose(result.rewards, reference, atol=1e-5, rtol=0)
    assert result.rewards.std() > 0  # a random model still tells the texts apart: the comparison can fail
    assert [m["score"] for m in result.metadata] == pytest.approx(result.rewards.tolist())


def test_a_classifier_with_several_labels_is_refused(tmp_path):
    tokenizer = build_char_tokenizer()
    config = LlamaConfig(vocab_size=len(tokenizer), hidden_size=16, intermediate_size=32, num_hidden_layers=1,
                         num_attention_heads=2, num_labels=3, pad_token_id=0)
    with pytest.raises(ValueError, match="num_labels=1"):
        RewardModelEnvironment(LlamaForSequenceClassification(config), tokenizer)


def test_any_batch_scorer_has_the_same_interface_and_its_failures_are_contained():
    calls = []

    def length_scorer(texts):
        calls.append(len(texts))
        if any("boom" in t for t in texts):
            raise RuntimeError("judge unavailable")
        return [float(len(t)) for t in texts]

    env = ScorerEnvironment(length_scorer, batch_size=2, name="length")
    convs = [[{"role": "user", "content": "a"}, {"role": "assistant", "content": c}] for c in ("xy", "z", "boom", "w")]
    result = env.step(convs, [{}] * 4)
    assert calls == [2, 2]
    assert result.rewards.tolist() == [4.0, 3.0, 0.0, 0.0]  # "a\nxy", "a\nz"; the failed chunk scores 0
    assert [e.split(":")[0] for e in result.errors] == ["sample 2", "sample 3"]
