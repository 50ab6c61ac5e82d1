"""``data.operations`` (the generated arithmetic task's operations) and ``data.prompt_template`` (every row's prompt
put into one text at load time, for any source): the rows they give, by value, and the problems they report."""

import json
import re

import pytest

from rlkit.data import DataParams, load_prompt_dataset
from rlkit.data.chat import render_prompts
from rlkit.envs.arithmetic import iter_arithmetic_rows
from rlkit.errors import ConfigError
from rlkit.models.tokenizer import build_char_tokenizer
from rlkit.stages.sft import sft_batch_as_trajectories

TOK = build_char_tokenizer()  # 4 tokens around the prompt + one per character
CHAT = "What is {prompt}? Answer with just the number."
EXPR = re.compile(r"^(\d+)([+*-])(\d+)$")


def generated(**kw):
    return load_prompt_dataset(DataParams(task="arithmetic", digits=1, num_train=40, num_validation=10, **kw))


def test_operations_draw_only_the_given_operations_with_right_answers():
    ds = generated(operations=("-", "*"))
    seen = set()
    for row in list(ds["train"]) + list(ds["validation"]):
        a, op, b = EXPR.match(row["prompt"]).groups()
        seen.add(op)
        assert row["answer"] == str(int(a) - int(b) if op == "-" else int(a) * int(b)), row
    assert seen == {"-", "*"}
    # validation: the first 10 distinct prompts of the generator's stream with those operations
    stream, first = iter_arithmetic_rows(1, 0, ("-", "*")), {}
    while len(first) < 10:
        row = next(stream)
        first.setdefault(row["prompt"], row)
    assert list(ds["validation"]) == list(first.values())


def test_default_operations_are_sums_as_before():
    assert DataParams().operations == ("+",)
    ds = generated()
    assert all("+" in p for p in ds["train"]["prompt"])
    assert list(ds["validation"])[0] == next(iter_arithmetic_rows(1, 0))  # the stream without operations


def test_template_wraps_every_generated_prompt_and_keeps_answers_and_splits():
    plain, chat = generated(), generated(prompt_template=CHAT)
    for split in ("train", "validation"):
        assert chat[split]["prompt"] == [f"What is {p}? Answer with just the number." for p in plain[split]["prompt"]]
        assert chat[split]["answer"] == plain[split]["answer"]
    first = plain["validation"]["prompt"][0]
    assert chat["validation"]["prompt"][0] == f"What is {first}? Answer with just the number."
    assert not set(chat["train"]["prompt"]) & set(chat["validation"]["prompt"])


def test_template_on_a_file_keeps_the_hold_out_and_literal_braces(tmp_path):
    path = tmp_path / "p.jsonl"
    rows = [{"prompt": f"word{i}", "answer": str(i)} for i in range(20)]
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    plain = load_prompt_dataset({"path": str(path), "validation_fraction": 0.25})
    braced = load_prompt_dataset({"path": str(path), "validation_fraction": 0.25,
                                  "prompt_template": "Reverse {{ {prompt} }}:"})
    for split in ("train", "validation"):
        assert braced[split]["prompt"] == [f"Reverse {{ {p} }}:" for p in plain[split]["prompt"]]
    assert braced["validation"]["prompt"][0].startswith("Reverse { word")


def test_template_on_reasoning_gym_rows_sets_answer_tag_when_it_asks_for_one():
    params = dict(task="reasoning_gym:chain_sum", num_train=2, num_validation=2)
    plain = load_prompt_dataset(DataParams(**params))["validation"]
    template = "{prompt}\nGive <answer>x</answer>."
    tagged = load_prompt_dataset(DataParams(**params, prompt_template=template))["validation"]
    assert tagged["prompt"] == [f"{q}\nGive <answer>x</answer>." for q in plain["prompt"]]
    assert plain["answer_tag"] == [False, False] and tagged["answer_tag"] == [True, True]


def test_length_filter_measures_the_templated_prompt():
    # raw prompts are 3-5 characters (7-9 tokens, all under 10); "Q: " makes them 10-12 tokens, so only the
    # 3-character ones ("a+b", one digit each) stay
    with pytest.warns(UserWarning, match=r"dropped \d+ of \d+ prompt\(s\) in the generated (train|validation) split"):
        ds = load_prompt_dataset(DataParams(task="arithmetic", digits=2, num_train=40, num_validation=10,
                                            prompt_template="Q: {prompt}"), TOK, 10)
    kept = list(ds["train"]["prompt"]) + list(ds["validation"]["prompt"])
    assert kept and all(re.fullmatch(r"Q: \d\+\d", p) for p in kept), kept
    assert max(len(ids) for ids in render_prompts(TOK, kept)) == 10


def test_sft_trains_on_the_templated_prompt():
    rows = list(generated(prompt_template=CHAT)["train"])[:3]
    batch = sft_batch_as_trajectories(TOK, rows, "answer")
    assert batch.prompts == tuple(r["prompt"] for r in rows) and batch.prompts[0].startswith("What is ")
    prompt_ids = render_prompts(TOK, [rows[0]["prompt"]])[0]
    assert batch.input_ids[0, : len(prompt_ids)].tolist() == prompt_ids


@pytest.mark.parametrize("template, message", [
    ("What is it?", r"data.prompt_template: 'What is it\?' has no \{prompt\}.*put \{prompt\} where"),
    ("{question}?", r"data.prompt_template: '\{question\}\?' has the field\(s\) \{question\}; the only field is "
                    r"\{prompt\}"),
    ("{prompt!r}", r"has the field\(s\) \{prompt!r\}"),
    ("{prompt} }", r"data.prompt_template: .* is not a format string .*write a literal brace as \{\{ or \}\}"),
])
def test_template_problems(template, message):
    problems = DataParams(task="arithmetic", prompt_template=template).problems()
    assert len(problems) == 1 and re.search(message, problems[0]), problems


def test_operation_problems():
    def problems(**kw):
        return [p for p in DataParams(**kw).problems() if p.startswith("data.operations")]

    assert problems(task="arithmetic", operations=("+", "/")) == [
        "data.operations: must be a non-empty list of '+', '-', '*', got ('+', '/'); e.g. data.operations=[+,-]"]
    assert problems(task="arithmetic", operations=()) != []
    assert problems(task="arithmetic", operations=("-", "*")) == []
    assert problems(task="tool_arithmetic", operations=("-",)) == []
    assert "add(a, b)" in problems(task="tool_arithmetic_native", operations=("-",))[0]
    assert "only read by data.task=arithmetic" in problems(task="reasoning_gym:chain_sum", operations=("-",))[0]


def test_distinct_prompt_count_uses_the_operations():
    # digits=1: 100 distinct sums, 300 with three operations
    one = DataParams(task="arithmetic", digits=1, num_validation=100).problems()
    assert any("allows only 100" in p and "data.num_validation" in p for p in one), one
    assert DataParams(task="arithmetic", digits=1, num_validation=100, operations=("+", "-", "*")).problems() == []
    three = DataParams(task="arithmetic", digits=1, num_validation=300, operations=("+", "-", "*")).problems()
    assert any("allows only 300" in p for p in three), three


def test_load_refuses_a_bad_template():
    with pytest.raises(ConfigError, match="data.prompt_template"):
        load_prompt_dataset({"task": "arithmetic", "prompt_template": "no field"})
