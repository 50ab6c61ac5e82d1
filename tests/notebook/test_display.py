"""Text and HTML displays: they show what the object holds, escape it, and compute nothing."""

from __future__ import annotations

import re
import subprocess
import sys
from types import SimpleNamespace

import pytest
import torch

from rlkit.config.loading import load_config
from rlkit.errors import StageOrderError
from rlkit.generation.base import Generation
from rlkit.models.bpe import build_bpe_tokenizer
from rlkit.models.tokenizer import build_char_tokenizer
from rlkit.stages.batching import trajectories_from_generation
from rlkit.notebook.charts import line_chart, sparkline, stacked_bars
from rlkit.run.metrics import StepMetrics
from tests.helpers import random_batch


def scored_batch():
    b = random_batch(b=8, t=20, group_size=4, seed=1).with_(tokenizer=build_char_tokenizer())
    rows = ({"prompt": "1<2", "answer": "x"}, {"prompt": "3+4", "answer": "7"})
    return b.with_(rows=rows, rewards=torch.tensor([1.0, 0, 0, 1, 0, 0, 1, 0]),
                   prev_logprobs=b.generator_logprobs - 0.01 * b.loss_mask,
                   completions=("<b>7</b>",) + b.completions[1:])


def test_trajectories_repr_and_table():
    b = scored_batch()
    assert repr(b) == ("Trajectories(B=8 = 2 prompts x 4, T=20, policy_version=0, "
                       "filled=['rewards', 'advantages', 'prev_logprobs'], reward_mean=0.375)")
    html = b._repr_html_()
    assert html.count("<tr>") == 1 + 8  # header + one row per sample
    for column in ("prompt", "completion", "reward", "advantage", "length", "finish"):
        assert f">{column}</th>" in html
    assert "1&lt;2" in html and "&lt;b&gt;7&lt;/b&gt;" in html and "<b>7</b>" not in html  # escaped, raw prompt shown
    first_adv = float(b.advantages[0][b.loss_mask[0]][0])
    assert f">{first_adv:.4g}</td>" in html
    assert "first 8 of 8 samples" in html


def test_table_is_capped_and_says_so():
    b = random_batch(b=40, t=12, group_size=4)
    html = b._repr_html_()
    assert html.count("<tr>") == 1 + 16 and "first 16 of 40 samples" in html


def test_token_view_colours_each_completion_token():
    b = scored_batch()
    view = b.show(color="advantages", rows=2)
    html = view._repr_html_()
    spans = re.findall(r"<span title='([^']*)' style='background:([^;]*);", html)
    assert len(spans) == int(b.loss_mask[:2].sum())  # one span per completion token of the 2 rows
    adv0 = float(b.advantages[0][b.loss_mask[0]][0])
    colour = spans[0][1]
    assert colour.startswith("rgba(0,150,60" if adv0 > 0 else "rgba(210,40,40")
    assert "advantage=" in spans[0][0] and "generator logprob=" in spans[0][0] and "trainer logprob=" in spans[0][0]
    text = repr(view)
    assert text.startswith("TokenView(advantage)") and text.count("\n") == 2

    mismatch = b.show(color="mismatch", rows=1)
    assert "+0.01" in repr(mismatch)  # |generator - trainer| = 0.01 on every completion token
    custom = b.show(color=b.loss_mask.float(), rows=1, label="clipped")
    assert "clipped" in custom._repr_html_()


def test_token_view_names_a_padding_vocabulary_id_and_says_why_it_appears():
    """Was rendered as "\ufffd117", which reads as broken decoding."""
    b = scored_batch()
    first = int(b.loss_mask[0].nonzero()[0])
    b = b.with_(input_ids=b.input_ids.clone().index_put_((torch.tensor([0]), torch.tensor([first])),
                                                          torch.tensor(117)))  # past the char tokenizer's 103
    view = b.show(rows=1)
    text, _, _, tip = view.rows[0][3][0]
    assert text == "<pad-vocab-117>" and "\ufffd" not in view._repr_html_()
    assert tip.startswith("token '<pad-vocab-117>' (id 117: an id of the model's padding vocabulary, past the "
                          "tokenizer's tokens: it has no text; an untrained model samples these, training makes them rare)")
    assert "None" not in view._repr_html_() and "None" not in repr(view)
    assert ">&lt;pad-vocab-117&gt;</span>" in view._repr_html_()


def test_show_takes_an_int_a_slice_or_a_list_of_sample_indices():
    b = scored_batch()
    prompts = lambda view: [row[0] for row in view.rows]  # noqa: E731
    rows = b.row_of_sample
    assert len(b.show(rows=3).rows) == 3
    assert prompts(b.show(rows=slice(4, 8))) == [rows[i]["prompt"] if rows else b.prompts[i] for i in range(4, 8)]
    view = b.show(rows=[5, 0, -1])
    assert [r[1] for r in view.rows] == [b.finish_reasons[i] for i in (5, 0, b.batch_size - 1)]
    assert [r[2] for r in view.rows] == [float(b.rewards[i]) for i in (5, 0, b.batch_size - 1)]
    with pytest.raises(IndexError, match=rf"rows=\[2, 99\]: sample\(s\) \[99\] are not in this batch of "
                                         rf"{b.batch_size} samples"):
        b.show(rows=[2, 99])


def test_token_view_decodes_with_the_tokenizer_the_batch_was_made_with():
    bpe = build_bpe_tokenizer()
    completion = bpe("café 語 3.14", add_special_tokens=False)["input_ids"]
    prompt = bpe("π=", add_special_tokens=False)["input_ids"]
    sample = (completion, [-0.5] * len(completion), "café 語 3.14", "stop")
    batch = trajectories_from_generation(Generation.from_samples([prompt], [sample], 1), 0, ["π="], tokenizer=bpe)
    view = batch.show(color=batch.loss_mask.float(), rows=1)
    shown = [piece[0] for piece in view.rows[0][3]]
    assert shown == bpe.convert_ids_to_tokens(completion)  # the vocabulary's own token names
    assert shown != build_char_tokenizer().convert_ids_to_tokens(completion)  # the guess the view used to make
    assert batch.show_conversation(0).pieces  # the conversation view decodes with it too


def test_a_batch_without_its_tokenizer_is_refused_not_decoded_with_a_guess():
    import pickle

    b = random_batch().with_(tokenizer=build_char_tokenizer())
    unpickled = pickle.loads(pickle.dumps(b))  # as a Ray worker receives it: the tokenizer stays behind
    assert unpickled.tokenizer is None and torch.equal(unpickled.input_ids, b.input_ids)
    for batch in (random_batch(), unpickled):
        with pytest.raises(ValueError, match=r"tokenizer=session.tokenizer"):
            batch.show(color=batch.loss_mask.float())
        with pytest.raises(ValueError, match=r"tokenizer=session.tokenizer"):
            batch.show_conversation(0)
    assert unpickled.show(color=b.loss_mask.float(), tokenizer=build_char_tokenizer()).rows


def test_token_view_guards_missing_fields():
    b = random_batch().with_(tokenizer=build_char_tokenizer())
    with pytest.raises(StageOrderError, match=r"logprobs\(\)"):
        b.show(color="mismatch")
    with pytest.raises(ValueError, match="advantages"):
        b.show(color="rainbow")


def test_step_metrics_repr_and_grouped_html():
    m = StepMetrics(3, 7, {"rollout/reward_mean": 0.5, "train/loss": 0.125, "train/kl": 0.01, "timing/train": 0.2})
    assert repr(m) == "StepMetrics(step=3, reward_mean=0.5, loss=0.125, kl=0.01)"
    html = m._repr_html_()
    assert "step 3 (policy version 7)" in html
    for group in ("rollout", "train", "timing"):
        assert f"<b>{group}</b>" in html


def test_config_repr_lists_only_changes_and_html_lists_everything():
    cfg = load_config("quickstart", ["grpo.num_prompts_per_step=4", "loss_fn.ratio_clip_max=0.28"])
    text = repr(cfg)
    assert text.startswith("RunConfig(") and "grpo.num_prompts_per_step=4" in text
    assert "loss_fn.ratio_clip_max=0.28" in text or "more changed" in text
    assert "seed=" not in text  # unchanged settings are left out
    assert repr(cfg.grpo).startswith("GRPOConfig(") and "num_prompts_per_step=4" in repr(cfg.grpo)
    html = cfg._repr_html_()
    assert "<b>4</b>" in html and "policy.optimizer.lr" in html and "loss_fn.kl_estimator" in html
    assert html.count("<details>") == len(type(cfg).model_fields) - 2  # one block per section; name, seed inline


class Tripwire:
    """Stand-in for a policy or generator: attributes are readable, any method call fails the test."""

    def __init__(self, **attributes):
        self.__dict__.update(attributes)

    def __getattr__(self, name):
        raise AssertionError(f"a display called or read {name!r}: displays must not compute")

    def __repr__(self):
        return "Tripwire()"


def run_view(config, policy, env, step=0, generator_version=0, history=()):
    """A stand-in for the card's run (attributes only: rlkit.run.run.Run's names)."""
    return SimpleNamespace(config=config, policy=policy, generator=Tripwire(), components=SimpleNamespace(env=env),
                           loss_fn="RLLoss(ppo_clip)", state=SimpleNamespace(step=step, history=list(history)),
                           generator_version=generator_version, stale=generator_version != policy.version,
                           rollouts=None)


def test_session_display_reads_attributes_only():
    cfg = load_config("quickstart")
    arch = SimpleNamespace(family="llama", num_layers=2, hidden_size=64)
    run = run_view(cfg, Tripwire(version=5, arch=arch, layout=SimpleNamespace(sequence_parallel=False)),
                   SimpleNamespace(name="arithmetic"), step=5, generator_version=4,
                   history=[StepMetrics(5, 5, {"rollout/reward_mean": 0.25})])
    from rlkit.notebook.display import session_html, session_summary

    text = session_summary(run)
    assert "step=5" in text and "STALE" in text and "last reward=0.250" in text and "TP=1" in text
    html = session_html(run)
    assert "STALE: call session.refit()" in html and "version 4" in html and "ppo_clip" in html
    run.policy = None
    assert session_summary(run).startswith("Session(closed")


def test_session_display_names_the_backend_in_use():
    """A DTensor session shows DTensor and its FSDP layout, not Megatron-Core's TP/PP/CP/EP."""
    from rlkit.notebook.display import session_html, session_summary

    env = SimpleNamespace(name="arithmetic")
    dtensor = run_view(load_config("quickstart", {"policy.dtensor_cfg.enabled": True,
                                                  "policy.megatron_cfg.enabled": False}),
                       Tripwire(version=0, arch=None, dp_size=1), env)
    text = session_summary(dtensor)
    assert "backend=DTensor (FSDP2)" in text and "FSDP2 DP=1" in text and "TP=" not in text
    assert "Megatron" not in text and "Megatron" not in session_html(dtensor)

    megatron = run_view(load_config("quickstart"),
                        Tripwire(version=0, arch=None, layout=SimpleNamespace(sequence_parallel=False)), env)
    text = session_summary(megatron)
    assert "backend=Megatron-Core" in text and "TP=1 PP=1 CP=1 EP=1" in text


def test_charts_carry_their_points_and_skip_missing_values():
    svg = line_chart("reward", [1, 2, 3, 4], {"mean": [0.1, float("nan"), 0.3, 0.4]})
    assert "data-points='3'" in svg and svg.count("<polyline") == 1 and "mean 0.4" in svg
    assert "data-points='1'" in line_chart("kl", [1], {"kl": [0.5]})
    bars = stacked_bars("time", [1, 2], {"rollout": [0.1, 0.2], "train": [0.3, 0.1]})
    assert bars.count("<rect") == 4 and "rollout 0.2" in bars
    assert sparkline([1, 2, 3]) == "▁▅█" and sparkline([]) == ""


def test_chart_axis_labels_tell_a_narrow_range_apart():
    """The mismatch panel sits near 1.000001: 3 significant digits would label both ends "1"."""
    axis = lambda svg: re.findall(r"text-anchor='end'>([^<]*)<", svg)[:2]  # noqa: E731 - top, bottom
    assert axis(line_chart("mismatch", [1, 2], {"x": [1.0, 1.0004]})) == ["1.0004", "1"]
    narrow = line_chart("mismatch", [1, 2], {"x": [1.000001, 1.000002]})
    assert axis(narrow) == ["+1e-06", "1"]  # too long for the margin: the top as an offset from the bottom
    assert "x 1.000002" in narrow  # the latest value keeps its digits
    assert axis(line_chart("reward", [1, 2], {"x": [0.1, 0.4]})) == ["0.4", "0.1"]
    assert "no data yet" in line_chart("kl", [], {"kl": []}) and "no data yet" not in narrow

def test_importing_displays_does_not_import_ipywidgets():
    code = ("import sys, rlkit, rlkit.notebook.display, rlkit.notebook.dashboard, rlkit.trajectories;"
            "print('ipywidgets' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"
