"""Text and HTML summaries of sessions, batches, step metrics and configs.

They read attributes only: no forward pass, no I/O, nothing that waits on an engine. (Cheap reductions of
tensors a batch already holds, like one mean over ``[B]`` rewards, are formatting, not compute.)
The owning classes take these functions as their ``__repr__`` / ``_repr_html_`` methods, so all notebook
presentation lives in this package.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Optional, Union

import torch

from rlkit.notebook.html import CELL, MUTED, STYLE, diverging, esc, fmt, key_values, legend, metrics_table, \
    sequential, table, token_span

SAMPLE_COLUMNS = ("#", "group", "prompt", "completion", "reward", "advantage", "length", "finish")


# ---- session -----------------------------------------------------------------------------------------------
def session_facts(run: Any, startup: Any = None) -> dict[str, object]:
    """The session card's facts, read from its run (a :class:`rlkit.run.run.Run`) and its ``startup`` report."""
    cfg = run.config
    if run.policy is None:
        return {"state": "closed (create a new Session to continue)"}
    policy, env = run.policy, run.components.env
    arch = getattr(policy, "arch", None)
    backend = cfg.policy.backend_section  # the section build_policy built
    facts = {
        "model": f"{cfg.policy.model_name}" + (f" ({arch.family}, {arch.num_layers} layers x {arch.hidden_size})" if arch else ""),
        "backend": backend.title,
        "policy": f"{type(policy).__name__} on {'cuda' if torch.cuda.is_available() else 'cpu'}",
        "parallel layout": backend.layout_words(cfg.policy.num_workers),
        "generator": f"{cfg.policy.generation.backend} ({'colocated' if cfg.generation_colocated else 'separate'}): "
                     f"{run.generator!r}",
        "environment": getattr(env, "name", type(env).__name__),
        "chat template": chat_template_words(cfg.data.chat_template_kwargs, getattr(env, "tool_schemas", None)),
        "loss": repr(run.loss_fn),
        # read from the policy's own record (no method call: a Ray group would wait on its workers)
        "reference weights": (ref.residency() if (ref := vars(policy).get("reference")) is not None else "-"),
        "advantages": cfg.grpo.advantage_estimator,
        "step": run.state.step,
        "policy version": policy.version,
        "generator weights": f"version {run.generator_version}"
                             + (" (STALE: call session.refit())" if run.stale else " (in sync)"),
        "last reward": f"{run.state.history[-1]['rollout/reward_mean']:.3f}" if run.state.history else "-",
    }
    if run.rollouts is not None:  # the rollout source: plain, dynamic sampling, async GRPO
        facts["rollouts"] = repr(run.rollouts)
    if startup is not None:
        facts["start-up"] = startup.breakdown() + ("" if startup.verbose else
                                                   f" ({startup.held_back} known third-party notices held back)")
    return facts


def chat_template_words(kwargs: Any, tools: Any = None) -> str:
    """How prompts are rendered: ``data.chat_template_kwargs`` (or the template's defaults) and the JSON tools."""
    words = ", ".join(f"{k}={v!r}" for k, v in dict(kwargs or {}).items()) or "the template's defaults"
    names = [t.get("function", t).get("name", "?") for t in tools or ()]
    return words + (f"; tools: {', '.join(names)}" if names else "")


def start_warnings(startup: Any) -> list[str]:
    """The warnings shown while the session started (rlkit's own config and data checks, anything unexpected)."""
    return list(getattr(startup, "warnings", []))


def session_summary(run: Any, startup: Any = None) -> str:
    f = session_facts(run, startup)
    if "state" in f:
        return f"Session({f['state']})"
    keys = ("model", "backend", "parallel layout", "environment", "step", "policy version", "generator weights",
            "last reward")
    return ("Session(" + ", ".join(f"{k}={f[k]}" for k in keys) + ")"
            + "".join(f"\n  warning at start: {w}" for w in start_warnings(startup)))


def session_html(run: Any, startup: Any = None) -> str:
    """The session card: rlkit's warnings from the start on top (easy to miss among cell output), then the facts."""
    shown = start_warnings(startup)
    box = ""
    if shown:
        items = "".join(f"<li>{esc(w)}</li>" for w in shown)
        box = (f"<div class='rlkit-start-warnings' style='background:#fff3cd;border:1px solid #e0b000;padding:4px 8px;"
               f"margin-bottom:4px;font-family:monospace;font-size:12px'><b>{len(shown)} warning(s) at start</b>"
               f"<ul style='margin:2px 0'>{items}</ul></div>")
    return box + key_values("rlkit Session", session_facts(run, startup))


# ---- trajectories ------------------------------------------------------------------------------------------
def _filled(batch: Any) -> list[str]:
    names = ("rewards", "advantages", "prev_logprobs", "ref_logprobs", "entropy", "values", "teacher_logprobs")
    return [n for n in names if getattr(batch, n) is not None]


def trajectories_summary(batch: Any) -> str:
    reward = f", reward_mean={float(batch.rewards.mean()):.3f}" if batch.rewards is not None and len(batch) else ""
    return (f"Trajectories(B={batch.batch_size} = {batch.num_prompts} prompts x {batch.group_size}, "
            f"T={batch.input_ids.shape[1]}, policy_version={batch.policy_version}, filled={_filled(batch)}{reward})")


def sample_rows(batch: Any, limit: int = 16) -> list[list[Any]]:
    """``[#, group, prompt, completion, reward, advantage, length, finish]`` for the first ``limit`` samples.

    The prompt is the dataset row's raw prompt when the batch carries rows (else the rendered text); the
    advantage is the mean over the sample's completion tokens (constant per sample for GRPO)."""
    n = min(limit, batch.batch_size)
    rows = batch.row_of_sample
    rewards = batch.rewards[:n].tolist() if batch.rewards is not None else [None] * n
    lengths = batch.completion_lengths[:n]
    adv = (batch.advantages[:n].sum(1) / lengths.clamp(min=1)).tolist() if batch.advantages is not None else [None] * n
    return [[i, i // batch.group_size, rows[i].get("prompt", batch.prompts[i]) if rows else batch.prompts[i],
             batch.completions[i], rewards[i], adv[i], int(lengths[i]), batch.finish_reasons[i]] for i in range(n)]


def trajectories_html(batch: Any, limit: int = 16) -> str:
    info = batch.info
    facts = [f"B={batch.batch_size} ({batch.num_prompts} prompts x {batch.group_size} samples)",
             f"T={batch.input_ids.shape[1]}", f"policy version {batch.policy_version}",
             f"filled: {', '.join(_filled(batch)) or 'nothing yet (run score())'}"]
    if "token_mult_prob_error" in info:
        facts.append(f"generator/trainer mismatch {info['token_mult_prob_error']:.5f}")
    if batch.reward_errors:
        facts.append(f"<span style='color:#c00'>{len(batch.reward_errors)} reward error(s)</span>")
    truncated = sum(r == "length" for r in batch.finish_reasons)
    if truncated:
        facts.append(f"{truncated} truncated")
    shown = min(limit, batch.batch_size)
    note = (f"<div style='{MUTED};font-size:11px'>first {shown} of {batch.batch_size} samples; "
            "batch.show(color='advantages' | 'mismatch' | 'teacher') colours the tokens</div>")
    return (f"<div style='font-family:monospace;font-size:12px'><b>Trajectories</b> · {' · '.join(facts)}</div>"
            + table(SAMPLE_COLUMNS, sample_rows(batch, limit)) + note)


# ---- token-level view ----------------------------------------------------------------------------------------
@dataclasses.dataclass(frozen=True)
class TokenView:
    """The completion tokens of some samples, each coloured by one per-token value (a hover shows them all).

    Made by ``Trajectories.show``; displays as HTML in a notebook and as text elsewhere."""

    label: str
    rows: tuple  # per sample: (prompt, finish reason, reward, ((token text, value, css colour, tooltip), ...))
    legend_html: str

    def _repr_html_(self) -> str:
        lines = []
        for prompt, finish, reward, tokens in self.rows:
            spans = "".join(token_span(text, colour, tip) for text, _, colour, tip in tokens)
            lines.append(f"<tr><td style='{CELL};{MUTED}'>{esc(prompt)}</td><td style='{CELL}'>{spans}</td>"
                         f"<td style='{CELL}'>{fmt(reward)}</td><td style='{CELL}'>{esc(finish)}</td></tr>")
        head = "".join(f"<th style='{CELL}'>{h}</th>" for h in ("prompt", f"completion tokens, coloured by {esc(self.label)}",
                                                                 "reward", "finish"))
        return (f"<div style='font-size:11px'>{self.legend_html}</div>"
                f"<table style='{STYLE}'><tr>{head}</tr>{''.join(lines)}</table>")

    def __repr__(self) -> str:
        out = [f"TokenView({self.label})"]
        for prompt, finish, reward, tokens in self.rows:
            toks = " ".join(f"{t!r}:{v:+.3g}" for t, v, _, _ in tokens)
            out.append(f"  {prompt!r} reward={fmt(reward)} [{finish}] {toks}")
        return "\n".join(out)


def undecodable_token(token_id: int) -> str:
    """How a token id the tokenizer has no text for is shown: ``<pad-vocab-117>``.

    Models pad the vocabulary past the tokenizer's (the nano model has 128 ids for 103 tokens), and an untrained
    one samples those ids. rlkit samples them rather than masking them in the generator: a mask there alone
    would make the generator sample from another distribution than the one the trainer scores (its logprobs and
    the importance ratios would disagree), and training makes them rare. Shown by name, with a hover that says why
    they appear."""
    return f"<pad-vocab-{token_id}>"


PAD_VOCAB_TIP = ("an id of the model's padding vocabulary, past the tokenizer's tokens: it has no text; an untrained "
                 "model samples these, training makes them rare")


def batch_tokenizer(batch: Any, tokenizer: Any = None) -> Any:
    """``tokenizer`` if given, else the one the batch was made with; a batch that knows none is refused (decoding
    with a guess shows wrong tokens and nothing would say so)."""
    tok = tokenizer if tokenizer is not None else getattr(batch, "tokenizer", None)
    if tok is None:
        raise ValueError("this batch does not know the tokenizer that made its token ids (it was built by hand or "
                         "came through pickling): pass one, e.g. batch.show(tokenizer=session.tokenizer)")
    return tok


def shown_rows(rows: Any, batch_size: int) -> list[int]:
    """The sample indices ``rows`` names: the first ``rows`` (an int), a slice, or a list of indices (negative
    ones count from the end); an index past the batch is an IndexError naming the batch size."""
    if isinstance(rows, bool):
        raise TypeError("rows= takes an int (the first N samples), a slice or a list of sample indices, not a bool")
    if isinstance(rows, int):
        return list(range(min(max(rows, 0), batch_size)))
    if isinstance(rows, slice):
        return list(range(batch_size))[rows]
    picked = [int(i) for i in (rows.tolist() if hasattr(rows, "tolist") else rows)]
    bad = [i for i in picked if not -batch_size <= i < batch_size]
    if bad:
        raise IndexError(f"rows={list(picked)}: sample(s) {bad} are not in this batch of {batch_size} samples "
                         f"(indices 0-{batch_size - 1})")
    return [i % batch_size for i in picked]


def token_view(batch: Any, color: Union[str, Any] = "advantages", tokenizer: Any = None, rows: Any = 8,
               label: Optional[str] = None) -> TokenView:
    """See :meth:`rlkit.trajectories.Trajectories.show`."""
    tok = batch_tokenizer(batch, tokenizer)
    mask = batch.loss_mask
    if color == "mismatch":  # (a tensor compared with a string is False)
        trainer = batch.require("prev_logprobs", "logprobs()")
        values, label = (batch.generator_logprobs - trainer).abs(), "|generator - trainer logprob|"
        paint = lambda v: sequential(v, 1.0, log_floor=1e-6)  # noqa: E731
        key = [(paint(x), f"{x:g}") for x in (1e-6, 1e-4, 1e-2, 1.0)]
    elif color == "teacher":  # where the distillation teacher disagrees: red where the student is surer than it
        teacher = batch.require("teacher_logprobs", "teacher_logprobs()")
        values, label = (batch.generator_logprobs - teacher) * mask, "student - teacher logprob"
        scale = float(values[mask].abs().max()) if mask.any() else 1.0
        paint = lambda v: diverging(-v, scale)  # noqa: E731
        key = [(paint(scale), f"+{scale:.3g} (teacher: unlikely)"), ("transparent", "0"),
               (paint(-scale), f"{-scale:.3g}")]
    else:
        if isinstance(color, torch.Tensor):
            values, label = color.float(), label or "value"
        elif color in ("advantages", "entropy"):
            values = batch.require(color, "advantages()" if color == "advantages" else "logprobs()")
            label = color.removesuffix("s")
        else:
            raise ValueError(f"color={color!r}: use 'advantages', 'mismatch', 'teacher', 'entropy' or a [B, T] tensor")
        scale = float(values[mask].abs().max()) if mask.any() else 1.0
        if color == "advantages" or bool((values[mask] < 0).any()):  # signed: red below 0, green above
            paint = lambda v: diverging(v, scale)  # noqa: E731
            key = [(paint(-scale), f"{-scale:.3g}"), ("transparent", "0"), (paint(scale), f"+{scale:.3g}")]
        else:
            paint = lambda v: sequential(v, scale)  # noqa: E731
            key = [("transparent", "0"), (paint(scale), f"{scale:.3g}")]
    extra = {"generator logprob": batch.generator_logprobs, "trainer logprob": batch.prev_logprobs,
             "teacher logprob": batch.teacher_logprobs, "advantage": batch.advantages}
    shown = []
    for i in shown_rows(rows, batch.batch_size):
        positions = mask[i].nonzero().flatten().tolist()
        ids = batch.input_ids[i, positions].tolist()
        tokens = []
        for p, tid, name in zip(positions, ids, tok.convert_ids_to_tokens(ids)):
            text, v = undecodable_token(tid) if name is None else name, float(values[i, p])
            tip = f"token {text!r} (id {tid}{': ' + PAD_VOCAB_TIP if name is None else ''}) {label}={v:.4g}" + "".join(
                f", {name}={float(t[i, p]):.4g}" for name, t in extra.items() if t is not None)
            tokens.append((str(text), v, paint(v), tip))
        prompt = batch.row_of_sample[i].get("prompt", batch.prompts[i]) if batch.rows else batch.prompts[i]
        reward = float(batch.rewards[i]) if batch.rewards is not None else None
        shown.append((prompt, batch.finish_reasons[i], reward, tuple(tokens)))
    return TokenView(label, tuple(shown), f"{esc(label)}: " + legend(key))


# ---- step metrics ---------------------------------------------------------------------------------------------
def metrics_summary(m: Any) -> str:
    keys = ("rollout/reward_mean", "train/loss", "train/kl", "train/clipped_fraction",
            "train/token_mult_prob_error", "timing/step_total")
    shown = ", ".join(f"{k.split('/')[1]}={m.values[k]:.4g}" for k in keys if k in m.values)
    return f"StepMetrics(step={m.step}, {shown})"


def metrics_html(m: Any) -> str:
    return metrics_table(f"step {m.step} (policy version {m.policy_version})", m.values)


def report_html(caption: str, loss_fn: str, metrics: Any) -> str:
    """A loss or train report: which loss (with its key settings) above its metrics."""
    return (f"<div style='font-family:monospace;font-size:12px'>loss function: <b>{esc(loss_fn or '?')}</b></div>"
            + metrics_table(caption, metrics))


# ---- configs ---------------------------------------------------------------------------------------------------
def _fields(section: Any) -> list[tuple[str, Any, Any]]:
    """``(name, value, default)`` of a pydantic section or a config dataclass (default ``...`` if required)."""
    if hasattr(type(section), "model_fields"):
        return [(n, getattr(section, n), f.get_default(call_default_factory=True))
                for n, f in type(section).model_fields.items()]
    if dataclasses.is_dataclass(section):
        missing = dataclasses.MISSING
        return [(f.name, getattr(section, f.name), f.default if f.default is not missing
                 else f.default_factory() if f.default_factory is not missing else ...)
                for f in dataclasses.fields(section)]
    return []


def config_leaves(section: Any, prefix: str = "") -> list[tuple[str, Any, Any]]:
    """Every leaf setting as ``(dotted.key, value, default)``."""
    out = []
    for name, value, default in _fields(section):
        key = f"{prefix}{name}"
        if hasattr(type(value), "model_fields") or (dataclasses.is_dataclass(value) and not isinstance(value, type)):
            out += config_leaves(value, key + ".")
        else:
            out.append((key, value, default))
    return out


def _short(value: Any) -> str:
    if callable(value) and not isinstance(value, type):
        return getattr(value, "__name__", type(value).__name__)
    return repr(value)


def config_summary(section: Any, limit: int = 12) -> str:
    """``ClassName(key=value, ...)`` listing only settings that differ from their defaults."""
    changed = [(k, v) for k, v, d in config_leaves(section) if v != d]
    parts = [f"{k}={_short(v)}" for k, v in changed[:limit]]
    if len(changed) > limit:
        parts.append(f"... {len(changed) - limit} more changed")
    return f"{type(section).__name__}({', '.join(parts) or 'defaults'})"


def config_html(section: Any) -> str:
    """Every setting by dotted key, one collapsible block per top-level section; settings that differ from the
    default are bold, with the default beside them."""
    groups: dict[str, list[list[str]]] = {}
    for key, value, default in config_leaves(section):
        changed = value != default
        shown = f"<b>{esc(_short(value))}</b>" if changed else esc(_short(value))
        row = [key, shown, f"<span style='{MUTED}'>{esc(_short(default))}</span>" if changed else "", changed]
        groups.setdefault(key.split(".")[0] if "." in key else "", []).append(row)
    blocks = []
    for name, rows in groups.items():
        body = table(["key", "value", "default (if changed)"], [r[:3] for r in rows], raw_columns=(1, 2))
        if not name:
            blocks.append(body)
            continue
        changed = sum(r[3] for r in rows)
        blocks.append(f"<details><summary style='font-family:monospace'>{esc(name)} "
                      f"<span style='{MUTED}'>({changed} changed of {len(rows)})</span></summary>{body}</details>")
    return f"<div><b style='font-family:monospace'>{esc(type(section).__name__)}</b>{''.join(blocks)}</div>"


__all__ = ["TokenView", "config_html", "config_leaves", "config_summary", "metrics_html", "metrics_summary",
           "report_html", "sample_rows", "session_facts", "session_html", "session_summary", "token_view", "trajectories_html",
           "trajectories_summary"]
