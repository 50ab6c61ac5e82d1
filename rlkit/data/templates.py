"""``data.prompt_template``: every row's prompt put into one text at load time, whatever the source.

Why: a generated task's prompt is bare (``"27+82"``), fine for a tiny model trained from scratch but not what a
pretrained chat model is asked; ``prompt_template: "What is {prompt}? Answer with just the number."`` makes it a
question. The template is applied once, when the data loads, to the ``prompt`` column, which is what everything
reads: the rollout, the SFT warm start, evaluation, the rollout records and the reward's ``prompts``. The
over-long-prompt filter (:mod:`rlkit.data.lengths`) measures the templated prompt; the empty-prompt check looks at
the prompt before it (a template around an empty prompt asks nothing). Rows that carry ``answer_tag``
(reasoning-gym's) are marked as asking for ``<answer>`` when the template asks for it.

Train and validation stay disjoint: a template is the same text around each prompt, so two different prompts
never become the same one.

Deliberate simplifications: ``str.format`` syntax, one field, ``{prompt}`` (repeatable), no format spec or
conversion; a literal brace is written ``{{`` or ``}}``.
"""

from __future__ import annotations

import string
from typing import Optional

import pyarrow as pa
from datasets import Dataset
from datasets.table import InMemoryTable

from rlkit.envs.reasoning_gym import ANSWER_TAG

_EXAMPLE = "'What is {prompt}? Answer with just the number.'"


def template_problems(template: Optional[str]) -> list[str]:
    """Why ``template`` cannot be a ``data.prompt_template`` (each problem with the key and the fix); [] if it can."""
    if template is None:
        return []
    if not isinstance(template, str):
        return [f"data.prompt_template: must be text with {{prompt}} in it, e.g. {_EXAMPLE}; got {template!r}"]
    try:
        fields = [(name, spec, conversion) for _, name, spec, conversion in string.Formatter().parse(template)
                  if name is not None]
    except ValueError as exc:
        return [f"data.prompt_template: {template!r} is not a format string ({exc}); write a literal brace as "
                "{{ or }}"]
    other = sorted({"{" + name + (f"!{conversion}" if conversion else "") + (f":{spec}" if spec else "") + "}"
                    for name, spec, conversion in fields if name != "prompt" or spec or conversion})
    if other:
        return [f"data.prompt_template: {template!r} has the field(s) {', '.join(other)}; the only field is {{prompt}} "
                "(no format spec or conversion), where each row's prompt goes; write a literal brace as {{ or }}"]
    if not fields:
        return [f"data.prompt_template: {template!r} has no {{prompt}}, so every row would get the same prompt; put "
                f"{{prompt}} where each row's prompt goes, e.g. {_EXAMPLE}"]
    return []


def apply_template(dataset: Dataset, template: Optional[str]) -> Dataset:
    """``dataset`` with each ``prompt`` replaced by ``template.format(prompt=prompt)`` (unchanged for None), and
    ``answer_tag`` set where the template asks for ``<answer>``."""
    if template is None:
        return dataset
    table = dataset.with_format("arrow")[:]  # the rows as one Arrow table (a selection's rows, in its order)
    prompts = [template.format(prompt=prompt) for prompt in table.column("prompt").to_pylist()]
    table = table.set_column(table.schema.get_field_index("prompt"), table.schema.field("prompt"),
                             pa.array(prompts, table.schema.field("prompt").type))
    if "answer_tag" in table.column_names and ANSWER_TAG in template:
        field = table.schema.field("answer_tag")
        table = table.set_column(table.schema.get_field_index("answer_tag"), field,
                                 pa.array([True] * len(prompts), field.type))
    return Dataset(InMemoryTable(table), info=dataset.info.copy())
