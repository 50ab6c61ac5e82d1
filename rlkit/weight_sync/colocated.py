"""Colocated refit: policy and generator share a process, so tensors are handed over directly.

The policy exports HF-named tensors one fused group at a time (embeddings, each layer, head); groups are
packed into buckets of at most ``bucket_bytes`` without ever splitting one (vLLM loads q/k/v and gate/up
into fused parameters and silently loads wrong weights from a split group). After the last bucket the
generator's prefix cache is reset, or later samples reuse attention state computed with the old weights.
That loop, :func:`refit_in_buckets`, is every transport's; a transport only says how one bucket travels.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Callable

from rlkit.generation.base import Generator
from rlkit.weights import HFGroup, WeightSource, bucket_groups


@dataclass(frozen=True)
class RefitReport:
    """What a refit moved into the generator, how fast, and which policy version the generator now holds."""

    seconds: float
    bytes_moved: int
    num_tensors: int
    num_buckets: int
    policy_version: int  # the weights the generator now holds

    @property
    def gigabytes_per_second(self) -> float:
        """Bytes moved per second of the refit, in GB/s."""
        return self.bytes_moved / max(self.seconds, 1e-9) / 1e9

    def __repr__(self) -> str:
        return (
            f"RefitReport({self.bytes_moved / 1e6:.1f} MB in {self.num_buckets} bucket(s), "
            f"{self.num_tensors} tensors, {self.seconds * 1e3:.1f} ms, version {self.policy_version})"
        )


def refit_in_buckets(policy: WeightSource, generator: Generator, bucket_bytes: float,
                     load: Callable[[HFGroup], None]) -> RefitReport:
    """``load`` each bucket of the policy's weights into ``generator``, then reset its prefix cache."""
    t0 = time.perf_counter()
    moved = tensors = buckets = 0
    for bucket in bucket_groups(policy.export_hf_groups(), bucket_bytes):
        load(bucket)
        moved += sum(t.numel() * t.element_size() for _, t in bucket)
        tensors += len(bucket)
        buckets += 1
    generator.reset_prefix_cache()
    return RefitReport(time.perf_counter() - t0, moved, tensors, buckets, policy.version)


class ColocatedWeightSync:
    def __init__(self, bucket_bytes: float = 256e6):
        self.bucket_bytes = bucket_bytes

    def sync(self, policy: WeightSource, generator: Generator) -> RefitReport:
        return refit_in_buckets(policy, generator, self.bucket_bytes, generator.update_weights)
