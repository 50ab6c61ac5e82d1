"""A byte-level BPE tokenizer with a ChatML chat template, made offline for the test models.

Why: the character tokenizer (:mod:`rlkit.models.tokenizer`) maps one character to one token, so it never
exercises what a real checkpoint's tokenizer does to an RL loop: several characters per token, one character
split over several tokens (multi-byte UTF-8), a chat template with a system turn, and several end-of-sequence
ids in ``generation_config.json`` (Qwen's ``<|im_end|>`` and ``<|endoftext|>``). No hub is reachable here, so
the tokenizer is trained with the ``tokenizers`` library on a small built-in corpus and saved as a standard HF
tokenizer folder (``tokenizer.json`` + ``tokenizer_config.json``) that transformers and vLLM load as they load
Qwen's.

The layout follows Qwen2/Qwen3: special tokens ``<|endoftext|>`` (id 0, also the pad token), ``<|im_start|>``
(1) and ``<|im_end|>`` (2, the tokenizer's EOS, ending every turn); ``generation_config.json`` lists both
``<|im_end|>`` and ``<|endoftext|>`` as EOS ids, so generation stops on either. Ids 0/1/2 are the pad/bos/eos
ids :func:`rlkit.models.factory.hf_config` writes into ``config.json``. The 256 byte symbols are always in the
vocabulary, so any text encodes (no unknown token) and decodes back byte for byte.

The template marks the assistant's reply and its ``<|im_end|>`` with ``{% generation %}``, so transformers'
``return_assistant_tokens_mask`` gives an independent check of rlkit's loss masks.

The normalizer (NFC) and pre-tokenizer (Qwen2's split regex, then bytes) are Qwen2's exactly: transformers
rebuilds that pipeline around the stored vocabulary whenever it loads a tokenizer into a Qwen-family folder
(``Qwen2Tokenizer``), and a Llama folder keeps ``tokenizer.json`` as written, so both load one tokenizer.

The template also renders tools the Hermes way (Qwen2.5's): ``tools=`` in the system turn (as ``name(params)``),
an assistant's ``tool_calls`` as ``<tool_call>\n{"name": ..., "arguments": ...}\n</tool_call>`` blocks, and
consecutive ``tool`` messages as ``<tool_response>`` blocks of one user turn (:mod:`rlkit.envs.tool_calls`).

Deliberate simplifications: no thinking markup in the template; training is deterministic for a
given corpus but the vocabulary is not any released tokenizer's.
"""

from __future__ import annotations

import json
import random
from pathlib import Path

from tokenizers import AddedToken, Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers, trainers
from transformers import PreTrainedTokenizerFast

ENDOFTEXT, IM_START, IM_END = "<|endoftext|>", "<|im_start|>", "<|im_end|>"
SPECIAL_TOKENS = (ENDOFTEXT, IM_START, IM_END)  # ids 0, 1, 2
EOS_TOKENS = (IM_END, ENDOFTEXT)  # generation stops on either; the first is the tokenizer's eos_token
# Qwen2.5's tool-call tags: added tokens, one id each, at the end of the vocabulary, and not special (decoded
# text keeps them, so a parser reads the calls from it)
TOOL_TAGS = ("<tool_call>", "</tool_call>", "<tool_response>", "</tool_response>")
BPE_VOCAB_SIZE = 512  # 256 bytes + 3 specials + 249 merges + 4 tool tags: a multiple of 128, so the tiny models stay tiny
# Qwen2's pre-tokenizer split (digits one by one; newlines grouped), the one transformers' Qwen2Tokenizer builds
QWEN2_SPLIT = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+"
               r"|\s+(?!\S)|\s+")

# ChatML with Hermes tool calls, as Qwen2.5's template writes them, with one shortening: the system turn lists
# each tool as ``name(param, ...)``, not its JSON schema and Qwen's paragraph of instructions (a schema is ~150
# tokens of this 512-token vocabulary, too long a prompt for a tiny model on a CPU). Without ``tools`` and tool
# messages it renders plain ChatML.
CHAT_TEMPLATE = (
    "{%- if tools %}"
    "{{- '<|im_start|>system\n' }}"
    "{%- if messages[0]['role'] == 'system' %}{{- messages[0]['content'] + '\n\n' }}{%- endif %}"
    "{{- '# Tools' }}"
    "{%- for tool in tools %}{%- set tool = tool['function'] if tool['function'] is defined else tool %}"
    "{{- '\n' + tool['name'] + '(' + (tool['parameters']['properties'] | list | join(', ')) + ')' }}{%- endfor %}"
    "{{- '<|im_end|>\n' }}"
    "{%- endif %}"
    "{%- for message in messages %}"
    "{%- if message['role'] == 'system' and tools and loop.first %}"
    "{%- elif message['role'] == 'tool' %}"
    "{%- if loop.first or messages[loop.index0 - 1]['role'] != 'tool' %}{{- '<|im_start|>user' }}{%- endif %}"
    "{{- '\n<tool_response>\n' + message['content'] + '\n</tool_response>' }}"
    "{%- if loop.last or messages[loop.index0 + 1]['role'] != 'tool' %}{{- '<|im_end|>\n' }}{%- endif %}"
    "{%- else %}"
    "{{- '<|im_start|>' + message['role'] + '\n' }}"
    "{%- if message['role'] == 'assistant' %}"
    "{% generation %}{{- message['content'] or '' }}"
    "{%- for call in message['tool_calls'] or [] %}"
    "{%- set call = call['function'] if call['function'] is defined else call %}"
    "{%- if loop.first and message['content'] %}{{- '\n' }}{%- elif not loop.first %}{{- '\n' }}{%- endif %}"
    "{{- '<tool_call>\n{\"name\": \"' + call['name'] + '\", \"arguments\": ' }}"
    "{{- (call['arguments'] if call['arguments'] is string else call['arguments'] | tojson) + '}\n</tool_call>' }}"
    "{%- endfor %}"
    "{{- '<|im_end|>' }}{% endgeneration %}{{- '\n' }}"
    "{%- else %}"
    "{{- message['content'] + '<|im_end|>' + '\n' }}"
    "{%- endif %}"
    "{%- endif %}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\n' }}{%- endif %}"
)

# Text in several scripts; frequent characters (é, π, ×) get merged into one token, characters seen once
# (the last line) stay split into their UTF-8 bytes, so both cases occur in tests.
_UTF8_LINES = (
    "Le café coûte 3 € et le thé 2 €. Déjà payé ? Très bien, élève !",
    "π ≈ 3.14159, 2 × 3 = 6, 6 ÷ 2 = 3, √16 = 4, 90° is a right angle, ½ + ½ = 1.",
    "Straße, Größe, über, schön: für die Prüfung üben wir Mathematik.",
    "Привет, мир! Сколько будет два плюс два? Четыре.",
    "数学の問題を解きましょう。答えは四です。",
    "Unicode once: Ω ∑ 語 🙂 👍🏽 ∞",
)
_NAMES = ("Natalia", "Weng", "Betty", "Julie", "James", "Albert", "Ken", "Alexis", "Tina", "Mark")
_ITEMS = ("clips", "apples", "books", "cookies", "marbles", "pages", "dollars", "eggs", "pencils", "cards")


def training_corpus(seed: int = 0) -> list[str]:
    """The built-in corpus: arithmetic, GSM8K-style word problems with boxed answers, chat phrases, the JSON of
    Hermes tool calls and their results (between the tags, which are added tokens), and multi-byte UTF-8 text.
    Deterministic for a given ``seed``."""
    rng = random.Random(seed)
    lines = []
    for _ in range(400):
        a, b = rng.randrange(1000), rng.randrange(1000)
        lines.append(f"{a}+{b}={a + b}")
    for _ in range(200):
        name, item = rng.choice(_NAMES), rng.choice(_ITEMS)
        x, y = rng.randrange(2, 60), rng.randrange(2, 60)
        lines.append(f"{name} has {x} {item} and buys {y} more. How many {item} does {name} have now? "
                     f"{name} has {x} + {y} = {x + y} {item}. The answer is \\boxed{{{x + y}}}.")
    for _ in range(200):  # as the template renders a call's JSON, so its keys and punctuation merge
        a, b = rng.randrange(10000), rng.randrange(1000)
        lines += [f"\n{json.dumps({'name': 'add', 'arguments': {'a': a, 'b': b}})}\n", f"\n{a + b}\n"]
    lines += ["Solve the problem step by step. Put the final answer in \\boxed{}.",
              "You are a helpful assistant.", "Let's think step by step."] * 20
    lines += list(_UTF8_LINES[:-1]) * 8 + [_UTF8_LINES[-1]]
    return lines


def build_bpe_tokenizer(vocab_size: int = BPE_VOCAB_SIZE, seed: int = 0) -> PreTrainedTokenizerFast:
    """Train the byte-level BPE on :func:`training_corpus`, add :data:`TOOL_TAGS` as the last ids (as Qwen2.5
    does), and wrap it with its chat template."""
    core = Tokenizer(models.BPE())
    core.normalizer = normalizers.NFC()
    core.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(QWEN2_SPLIT), behavior="isolated"),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
    ])
    core.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size - len(TOOL_TAGS),
        min_frequency=2,
        continuing_subword_prefix="",  # as Qwen2Tokenizer stores them, so a loaded copy equals this one
        end_of_word_suffix="",
        special_tokens=[AddedToken(t, special=True, normalized=False) for t in SPECIAL_TOKENS],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    core.train_from_iterator(training_corpus(seed), trainer=trainer)
    core.add_tokens([AddedToken(t, special=False, normalized=False) for t in TOOL_TAGS])
    tok = PreTrainedTokenizerFast(tokenizer_object=core, eos_token=IM_END, pad_token=ENDOFTEXT,
                                  additional_special_tokens=[IM_START])
    tok.chat_template = CHAT_TEMPLATE
    return tok


def save_bpe_tokenizer(folder: str | Path) -> PreTrainedTokenizerFast:
    """Write the tokenizer files and ``generation_config.json`` (both EOS ids) into ``folder``.

    Written after the model's ``save_pretrained``, whose ``generation_config.json`` holds a single EOS id.
    """
    folder = Path(folder)
    tok = build_bpe_tokenizer()
    tok.save_pretrained(str(folder))
    ids = {t: tok.convert_tokens_to_ids(t) for t in SPECIAL_TOKENS}
    generation = {"bos_token_id": ids[IM_START], "eos_token_id": [ids[t] for t in EOS_TOKENS],
                  "pad_token_id": ids[ENDOFTEXT]}
    (folder / "generation_config.json").write_text(json.dumps(generation, indent=2) + "\n")
    return tok
