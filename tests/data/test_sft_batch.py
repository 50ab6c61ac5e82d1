"""SFT batches follow the trajectories convention: right-padded, loss on response + EOS only."""

import pytest
import torch

from rlkit.data import build_sft_batch
from rlkit.errors import ModelError
from rlkit.models.tokenizer import build_char_tokenizer


def test_tokens_and_masks_exact():
    tok = build_char_tokenizer()
    rows = [{"prompt": "12+3", "answer": "15"}, {"prompt": "1+1", "answer": "2"}]
    input_ids, attention_mask, loss_mask = build_sft_batch(tok, rows)
    # Expected sequences written out token by token, independently of render_prompts.
    seqs = [
        ["<|bos|>", "<|user|>", "1", "2", "+", "3", "<|end|>", "<|assistant|>", "1", "5", "<|end|>"],
        ["<|bos|>", "<|user|>", "1", "+", "1", "<|end|>", "<|assistant|>", "2", "<|end|>", "<|pad|>", "<|pad|>"],
    ]
    assert input_ids.dtype == torch.int64 and input_ids.shape == (2, 11)
    assert input_ids.tolist() == [tok.convert_tokens_to_ids(s) for s in seqs]
    assert attention_mask.dtype == torch.bool and loss_mask.dtype == torch.bool
    assert attention_mask.tolist() == [[True] * 11, [True] * 9 + [False] * 2]
    assert loss_mask.tolist() == [[False] * 8 + [True] * 3, [False] * 7 + [True] * 2 + [False] * 2]
    assert tok.decode(input_ids[0][loss_mask[0]]) == "15<|end|>"
    assert (input_ids[1, 9:] == tok.pad_token_id).all()


def test_custom_keys_and_system_prompt():
    tok = build_char_tokenizer()
    batch = build_sft_batch(tok, [{"q": "7", "a": "x"}], response_key="a", prompt_key="q", system_prompt="s")
    assert tok.decode(batch.input_ids[0]) == "<|bos|><|system|>s<|end|><|user|>7<|end|><|assistant|>x<|end|>"
    assert batch.loss_mask[0].nonzero().flatten().tolist() == [8, 9]  # after bos,system,s,end,user,7,end,assistant


def test_errors_name_the_fix():
    tok = build_char_tokenizer()
    with pytest.raises(ValueError, match=r"row 0 needs 'prompt' and 'answer'; it has \['prompt', 'solution'\]"):
        build_sft_batch(tok, [{"prompt": "1", "solution": "2"}])
    tok.pad_token = None
    with pytest.raises(ModelError, match="no pad_token_id"):
        build_sft_batch(tok, [{"prompt": "1", "answer": "2"}])
