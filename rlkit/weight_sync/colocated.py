"""Colocated refit: policy and generator share a process, so tensors are handed over directly.

The policy exports HF-named tensors one fused group at a time (embeddings, each layer, head), and the whole
export streams into the generator through one ``update_weights`` call: the generator consumes it one tensor
at a time (vLLM reloads each layer once its last tensor arrives), so no more than a layer is held beyond the
model, and vLLM's fixed cost per reload call (a walk over all of its modules before and after) is paid once
per refit, not once per bucket (figures: docs/measurements.md). After the stream the generator's prefix cache
is reset, or later samples reuse attention state computed with the old weights.

That loop, :func:`stream_refit`, is every transport's: a transport says how the stream of groups travels
(the broadcast transport packs it into buckets of whole groups, because it stages bytes).
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Callable, Iterable, Iterator

from rlkit.generation.base import Generator
from rlkit.weights import HFGroup, WeightSource


@dataclass(frozen=True)
class RefitReport:
    """What a refit moved into the generator, how fast, and which policy version the generator now holds."""

    seconds: float
    bytes_moved: int
    num_tensors: int
    num_buckets: int  # load calls (colocated: 1, the whole stream) or buckets sent (broadcast)
    policy_version: int  # the weights the generator now holds

    def __repr__(self) -> str:
        return (
            f"RefitReport({self.bytes_moved / 1e6:.1f} MB in {self.num_buckets} bucket(s), "
            f"{self.num_tensors} tensors, {self.seconds * 1e3:.1f} ms, version {self.policy_version})"
        )


class _Tally:
    """Counts the tensors and bytes of the groups that pass through :meth:`count`."""

    def __init__(self) -> None:
        self.bytes = self.tensors = 0

    def count(self, groups: Iterable[HFGroup]) -> Iterator[HFGroup]:
        for group in groups:
            self.bytes += sum(t.numel() * t.element_size() for _, t in group)
            self.tensors += len(group)
            yield group


def stream_refit(policy: WeightSource, generator: Generator,
                 transport: Callable[[Iterator[HFGroup]], int]) -> RefitReport:
    """Hand the policy's exported groups, lazily, to ``transport`` (which returns how many buckets or load
    calls it used), then reset the generator's prefix cache."""
    t0 = time.perf_counter()
    tally = _Tally()
    buckets = transport(tally.count(policy.export_hf_groups()))
    generator.reset_prefix_cache()
    return RefitReport(time.perf_counter() - t0, tally.bytes, tally.tensors, buckets, policy.version)


class ColocatedWeightSync:
    """``sync(policy, generator) -> RefitReport`` for a generator in this process: the whole export in one
    ``update_weights`` call, then the prefix-cache reset. (An engine in another process gets
    :class:`rlkit.weight_sync.BroadcastWeightSync`, which sends buckets; handed one, this sync would send the
    whole model in one call.)"""

    def sync(self, policy: WeightSource, generator: Generator) -> RefitReport:
        def transport(groups: Iterator[HFGroup]) -> int:
            generator.update_weights(pair for group in groups for pair in group)
            return 1  # load calls

        return stream_refit(policy, generator, transport)

    def __repr__(self) -> str:
        return "ColocatedWeightSync(one streamed reload per refit)"


class SharedWeights:
    """``sync(policy, generator) -> RefitReport`` for a generator that samples from the policy's own model
    (``policy.generation.backend: megatron``): nothing moves; the report says the generator holds the policy's
    version now, which is what the staleness checks read."""

    def sync(self, policy: WeightSource, generator: Generator) -> RefitReport:
        generator.reset_prefix_cache()
        return RefitReport(0.0, 0, 0, 0, policy.version)

    def __repr__(self) -> str:
        return "SharedWeights(the generator reads the policy's own weights: a refit moves nothing)"

