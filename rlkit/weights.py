"""HF-named weight groups, the unit a policy exports and a generator loads: neutral ground that the policy,
generation and weight-sync packages all import, so none depends on another for what travels between them."""

from __future__ import annotations

from typing import Iterable, Iterator, Protocol

from torch import Tensor

HFGroup = list[tuple[str, Tensor]]  # HF-named tensors that must travel together (whole fused groups)


class WeightSource(Protocol):
    """What a weight sync reads from: any policy (every backend has these two)."""

    version: int  # the weights' version; a refit reports it as what the generator now holds

    def export_hf_groups(self) -> Iterator[HFGroup]: ...


def bucket_groups(groups: Iterable[HFGroup], max_bytes: float) -> Iterator[HFGroup]:
    """Concatenate whole groups into buckets of at most ``max_bytes`` (a single larger group is its own
    bucket). Groups are never split: vLLM loads q/k/v and gate/up into fused parameters, and a split group
    silently loads wrong weights."""
    bucket: HFGroup = []
    size = 0
    for group in groups:
        group_bytes = sum(t.numel() * t.element_size() for _, t in group)
        if bucket and size + group_bytes > max_bytes:
            yield bucket
            bucket, size = [], 0
        bucket.extend(group)
        size += group_bytes
    if bucket:
        yield bucket
