"""Preference pairs for DPO: rows of ``prompt``, ``chosen`` and ``rejected`` from a user's file, made from a task's
own answers (the answer chosen, a wrong number rejected), or from a scored rollout (the policy's own mistakes
rejected: :func:`pairs_from_batch`).

A pair's responses are plain text, as ``sft``'s answers are: the prompt goes through the chat template (with the
data's system prompt), and each response is followed by EOS (:func:`rlkit.data.sft.build_sft_batch`).
"""

from __future__ import annotations

from collections import Counter
from typing import Any, Iterable

import numpy as np

from rlkit.data.files import read_prompt_file
from rlkit.errors import DataError
from rlkit.trajectories import Trajectories

PAIR_COLUMNS = ("prompt", "chosen", "rejected")


def read_preference_file(path: str, key: str = "dpo.train_file") -> list[dict[str, Any]]:
    """The pairs of ``path`` (JSONL, JSON or parquet), each row with ``prompt``, ``chosen`` and ``rejected`` text;
    ``key`` names the config key in errors."""
    file = read_prompt_file(path, key)
    missing = [c for c in PAIR_COLUMNS if c not in file.dataset.column_names]
    if missing:
        raise DataError([f"{key}: {path!r} has no column {', '.join(map(repr, missing))}; a preference file has one "
                         f"row per pair with 'prompt', 'chosen' and 'rejected' (its columns: "
                         f"{', '.join(file.dataset.column_names)})"])
    rows = [{c: row[c] for c in PAIR_COLUMNS} for row in file.dataset]
    for row, label in zip(rows, file.labels):
        for column in PAIR_COLUMNS:
            if not isinstance(row[column], str) or not row[column]:
                raise DataError([f"{key}: {path!r} {label}: {column!r} must be non-empty text, got {row[column]!r}"])
        if row["chosen"] == row["rejected"]:
            raise DataError([f"{key}: {path!r} {label}: 'chosen' and 'rejected' are the same text, which teaches "
                             f"nothing; drop the row or give a worse response as 'rejected'"])
    return rows


def pairs_from_answers(rows: Iterable[dict[str, Any]], seed: int, response_key: str = "answer",
                       max_offset: int = 10) -> list[dict[str, Any]]:
    """One pair per task row with an integer answer: ``chosen`` the answer, ``rejected`` the answer moved by a
    seeded nonzero offset in [-max_offset, max_offset] (a near miss, as a wrong sum usually is)."""
    rng = np.random.default_rng(seed)
    pairs = []
    for i, row in enumerate(rows):
        answer = str(row.get(response_key, "")).strip()
        try:
            value = int(answer)
        except ValueError:
            raise DataError([f"dpo.train_file: unset, so pairs are made from the task's {response_key!r} answers, "
                             f"which must be integers; row {i}'s is {answer!r}. Give a JSONL of 'prompt', 'chosen', "
                             f"'rejected' rows as dpo.train_file"]) from None
        offset = int(rng.integers(1, max_offset + 1)) * (1 if rng.random() < 0.5 else -1)
        pairs.append({"prompt": row["prompt"], "chosen": answer, "rejected": str(value + offset)})
    return pairs


def pairs_from_batch(batch: Trajectories, response_key: str = "answer") -> list[dict[str, Any]]:
    """One pair per prompt of a scored ``batch`` (G samples per prompt) that has a sample with reward <= 0: the
    sample the policy wrote most often among those as ``rejected`` (its typical mistake); as ``chosen`` the sample
    with the highest reward above 0 (the most frequent among ties), else the row's ``response_key`` answer. Prompts
    whose samples all earned a reward, or that have neither a rewarded sample nor an answer, give no pair."""
    if batch.rewards is None:
        raise ValueError("pairs_from_batch needs a scored batch (session.score(batch)): rewards choose the samples")
    pairs = []
    g = batch.group_size
    for i, row in enumerate(batch.rows):
        samples = list(zip(batch.completions[i * g:(i + 1) * g], batch.rewards[i * g:(i + 1) * g].tolist()))
        wrong = Counter(text for text, reward in samples if reward <= 0)
        if not wrong:
            continue
        right = Counter(text for text, reward in samples if reward > 0)
        if right:
            best = max(r for _, r in samples)
            chosen = max((t for t, r in samples if r == best), key=lambda t: right[t])
        elif row.get(response_key) not in (None, ""):
            chosen = str(row[response_key])
        else:
            continue
        rejected = wrong.most_common(1)[0][0]
        if rejected != chosen:
            pairs.append({"prompt": row["prompt"], "chosen": chosen, "rejected": rejected})
    return pairs
