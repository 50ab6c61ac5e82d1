"""The byte-level BPE test tokenizer: folder layout, byte-exact decoding, chat template with a system turn,
assistant-only loss masks, and generation stopping on either EOS id through real vLLM.

References are independent of rlkit: GPT-2's byte-to-symbol table (written out here) for the bytes of each
token, transformers' ``return_assistant_tokens_mask`` (the template's ``{% generation %}`` block) for the
loss mask, and a model whose weights force one completion, so the expected tokens are known exactly.
"""

import json

import pytest
import torch
from safetensors.torch import load_file, save_file
from transformers import AutoTokenizer

from rlkit.config.components import GenerationConfig
from rlkit.data import build_sft_batch, render_prompts
from rlkit.errors import ModelError
from rlkit.generation.base import SamplingSettings
from rlkit.models import make_model
from rlkit.models.bpe import BPE_VOCAB_SIZE, build_bpe_tokenizer

MULTI_BYTE = "π=3.14 語🙂 café"
COMPLETION = "π=3.14 語🙂"  # what the forced model writes before its second EOS id


@pytest.fixture(scope="module")
def bpe_folder(tmp_path_factory):
    return make_model(tmp_path_factory.mktemp("bpe"), "nano", "qwen2", tokenizer="bpe")


@pytest.fixture(scope="module")
def tok(bpe_folder):
    return AutoTokenizer.from_pretrained(str(bpe_folder))


def gpt2_byte_symbols() -> dict[str, int]:
    """Symbol -> byte, GPT-2's table: printable bytes stand for themselves, the rest map from U+0100 on."""
    printable = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1), *range(ord("®"), ord("ÿ") + 1)]
    symbols, extra = {}, 0
    for b in range(256):
        if b in printable:
            symbols[chr(b)] = b
        else:
            symbols[chr(256 + extra)] = b
            extra += 1
    return symbols


def test_folder_holds_a_standard_tokenizer_with_two_eos_ids(bpe_folder, tok):
    config = json.loads((bpe_folder / "config.json").read_text())
    generation = json.loads((bpe_folder / "generation_config.json").read_text())
    assert len(tok) == BPE_VOCAB_SIZE == config["vocab_size"]
    assert {"tokenizer.json", "tokenizer_config.json"} <= {p.name for p in bpe_folder.iterdir()}
    assert tok.convert_ids_to_tokens([0, 1, 2]) == ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
    assert (tok.pad_token_id, tok.eos_token_id) == (config["pad_token_id"], config["eos_token_id"]) == (0, 2)
    assert generation["eos_token_id"] == [2, 0]  # <|im_end|>, then <|endoftext|>
    # deterministic, and one tokenizer whichever class loads it (Qwen folders rebuild Qwen2's pipeline around it)
    built = build_bpe_tokenizer().backend_tokenizer.to_str()
    llama = AutoTokenizer.from_pretrained(str(make_model(bpe_folder.parent / "llama", "nano", tokenizer="bpe")))
    assert built == tok.backend_tokenizer.to_str() == llama.backend_tokenizer.to_str()
    assert len(AutoTokenizer.from_pretrained(str(make_model(bpe_folder.parent / "char", "nano")))) == 103


def test_tool_tags_are_single_added_tokens_that_decoding_keeps(tok):
    """As in Qwen2.5's tokenizer: the Hermes tags are one id each at the end of the vocabulary and not special, so
    decoded text (even with ``skip_special_tokens``) still holds the calls a parser reads; the call's JSON keys are
    merged, so a call is a few dozen tokens, not one per character."""
    from rlkit.models.bpe import TOOL_TAGS

    ids = tok.convert_tokens_to_ids(list(TOOL_TAGS))
    assert ids == list(range(BPE_VOCAB_SIZE - 4, BPE_VOCAB_SIZE))
    call = '<tool_call>\n{"name": "add", "arguments": {"a": 4821, "b": 937}}\n</tool_call>'
    encoded = tok(call).input_ids
    assert encoded[0] == ids[0] and encoded[-1] == ids[1] and len(encoded) <= 32
    assert tok.decode(encoded, skip_special_tokens=True) == call
    assert tok.convert_ids_to_tokens(tok("4821").input_ids) == ["4", "8", "2", "1"]  # digits stay one by one


def test_make_model_command_offers_the_bpe_tokenizer(tmp_path, capsys):
    from rlkit.cli import main

    assert main(["make-model", str(tmp_path / "m"), "--preset", "nano", "--family", "qwen2", "--tokenizer", "bpe"]) == 0
    assert "bpe tokenizer" in capsys.readouterr().out
    assert json.loads((tmp_path / "m" / "generation_config.json").read_text())["eos_token_id"] == [2, 0]
    assert len(AutoTokenizer.from_pretrained(str(tmp_path / "m"))) == BPE_VOCAB_SIZE


def test_unknown_tokenizer_is_refused(tmp_path):
    with pytest.raises(ModelError, match="unknown tokenizer 'wordpiece'.*'char'.*'bpe'"):
        make_model(tmp_path / "m", "nano", tokenizer="wordpiece")
    assert not (tmp_path / "m").exists()


def test_multi_byte_characters_split_across_tokens_decode_byte_exactly(tok):
    ids = tok.encode(MULTI_BYTE, add_special_tokens=False)
    symbols = gpt2_byte_symbols()
    pieces = [bytes(symbols[c] for c in t) for t in tok.convert_ids_to_tokens(ids)]
    assert b"".join(pieces) == MULTI_BYTE.encode("utf-8")
    split = [p for p in pieces if not _is_utf8(p)]
    assert len(split) >= 4  # 語 and 🙂 are split over byte tokens; é is merged into one
    assert "é".encode() in pieces or any(p.endswith("é".encode()) for p in pieces)
    assert tok.decode(ids) == MULTI_BYTE
    # decoding a prefix that ends inside a character must not invent characters of the rest
    cut = next(i for i, p in enumerate(pieces) if not _is_utf8(p)) + 1
    assert tok.decode(ids[:cut]).endswith("\ufffd") and tok.decode(ids) == MULTI_BYTE


def _is_utf8(data: bytes) -> bool:
    try:
        data.decode("utf-8")
    except UnicodeDecodeError:
        return False
    return True


def test_chat_template_with_a_system_prompt(tok):
    text = tok.apply_chat_template([{"role": "system", "content": "Be terse."}, {"role": "user", "content": "2+2?"}],
                                   add_generation_prompt=True, tokenize=False)
    assert text == "<|im_start|>system\nBe terse.<|im_end|>\n<|im_start|>user\n2+2?<|im_end|>\n<|im_start|>assistant\n"
    ids = render_prompts(tok, ["2+2?"], system_prompt="Be terse.")[0]
    assert ids == tok(text, add_special_tokens=False)["input_ids"]
    assert ids.count(1) == 3 and ids.count(2) == 2  # three turn starts, two closed turns
    no_system = render_prompts(tok, ["2+2?"])[0]
    assert tok.decode(no_system) == "<|im_start|>user\n2+2?<|im_end|>\n<|im_start|>assistant\n"


def test_sft_loss_mask_covers_exactly_the_assistant_tokens(tok):
    rows = [{"prompt": "What is 7×6?", "answer": "42 ✓"}, {"prompt": "Say café", "answer": " café 🙂"}]
    batch = build_sft_batch(tok, rows, system_prompt="You are a helpful assistant.")
    for i, row in enumerate(rows):
        chat = [{"role": "system", "content": "You are a helpful assistant."},
                {"role": "user", "content": row["prompt"]}, {"role": "assistant", "content": row["answer"]}]
        ref = tok.apply_chat_template(chat, tokenize=True, return_dict=True, return_assistant_tokens_mask=True)
        ids, mask = ref["input_ids"][:-1], ref["assistant_masks"][:-1]  # the template's trailing "\n" ends the turn
        n = int(batch.attention_mask[i].sum())
        assert batch.input_ids[i, :n].tolist() == ids
        assert batch.loss_mask[i, :n].tolist() == [bool(m) for m in mask]
        assert not batch.loss_mask[i, n:].any()
        assert tok.decode(batch.input_ids[i][batch.loss_mask[i]]) == row["answer"] + "<|im_end|>"


def forced_model(folder, tok, prompt_ids: list[int], completion: list[int]):
    """Make the model write ``completion`` after ``prompt_ids`` whatever it samples: attention and MLP outputs
    are zeroed, so the last hidden state is the current token's embedding, and each lm_head row of the next
    token points along the previous token's embedding (a bigram table with a margin of ~80 logits)."""
    weights = load_file(str(folder / "model.safetensors"))
    for name, tensor in weights.items():
        if name.endswith(("o_proj.weight", "down_proj.weight")):
            tensor.zero_()
    weights["model.norm.weight"].fill_(1.0)
    emb, head = weights["model.embed_tokens.weight"], weights["lm_head.weight"]
    chain = [prompt_ids[-1]] + completion
    assert len(set(chain)) == len(chain), "the chain's tokens must be distinct for a bigram table"
    for prev, nxt in zip(chain, chain[1:]):
        head[nxt] = 10 * emb[prev] / emb[prev].norm()
    save_file(weights, str(folder / "model.safetensors"), metadata={"format": "pt"})


@pytest.fixture(scope="module")
def forced(tmp_path_factory, tok):
    folder = make_model(tmp_path_factory.mktemp("forced"), "nano", "qwen2", tokenizer="bpe", seed=1)
    prompt = render_prompts(tok, ["Write it."], system_prompt="You are terse.")[0]
    completion = tok.encode(COMPLETION, add_special_tokens=False) + [tok.convert_tokens_to_ids("<|endoftext|>")]
    forced_model(folder, tok, prompt, completion)
    return folder, prompt, completion


def test_vllm_stops_on_the_second_eos_id_and_decodes_byte_exactly(forced):
    from rlkit.generation.vllm import VllmGenerator

    folder, prompt, completion = forced
    sampling = SamplingSettings(temperature=1.0, max_new_tokens=len(completion) + 8, seed=0)
    generator = VllmGenerator(folder, GenerationConfig(), max_model_len=64)
    try:
        out = generator.generate([prompt], 2, sampling)
    finally:
        generator.close()
    assert [list(t) for t in out.token_ids] == [completion, completion]  # ends in <|endoftext|>, id 0
    assert out.finish_reasons == ("stop", "stop")
    assert out.texts == (COMPLETION, COMPLETION)  # 語 and 🙂 arrive as byte tokens, decoded whole

    # control: with only <|im_end|> listed, the same model runs on past <|endoftext|> to the length limit
    generation = json.loads((folder / "generation_config.json").read_text())
    (folder / "generation_config.json").write_text(json.dumps(dict(generation, eos_token_id=[2])))
    try:
        generator = VllmGenerator(folder, GenerationConfig(), max_model_len=64)
        control = generator.generate([prompt], 1, sampling)
        generator.close()
    finally:
        (folder / "generation_config.json").write_text(json.dumps(generation))
    assert control.finish_reasons == ("length",) and len(control.token_ids[0]) == sampling.max_new_tokens
    assert list(control.token_ids[0][: len(completion)]) == completion


def test_hf_generator_stops_on_the_second_eos_id_too(forced):
    from rlkit.generation.hf import HFGenerator

    folder, prompt, completion = forced
    generator = HFGenerator(folder, GenerationConfig(backend="hf"), max_model_len=64)
    assert generator.eos_token_ids == [2, 0]
    out = generator.generate([prompt], 2, SamplingSettings(temperature=1.0, max_new_tokens=len(completion) + 8, seed=0))
    assert [list(t) for t in out.token_ids] == [completion, completion]
    assert out.finish_reasons == ("stop", "stop") and out.texts == (COMPLETION, COMPLETION)
    assert torch.tensor(out.logprobs[0]).abs().max() < 1e-3
