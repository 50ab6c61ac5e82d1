"""Where a policy worker group's ranks run: a Ray placement group sized from the cluster, not the driver.

Ranks that share a tensor-parallel group (and, for MoE, an expert-parallel group) exchange activations in
every layer, so they are packed onto one node where one node can hold them, as NeMo-RL and verl do: each
such *pack* of consecutive ranks is one placement-group bundle (a bundle never spans nodes), and the bundles
are placed with Ray's ``PACK`` strategy (as few nodes as possible). Megatron numbers ranks tensor-parallel
first, so consecutive ranks form the tensor-parallel groups; ranks are therefore handed out bundle by bundle,
grouped by node, and the rank order follows the placement.

Resources come from the cluster: a rank reserves one CPU, and one GPU when the cluster has GPUs
(``ray.cluster_resources()``), whatever the driver's machine has; a rank's thread count is its node's CPUs
divided by the ranks placed there. A group that cannot be placed within ``policy.ray_cfg.placement_timeout_s``
fails with :class:`PlacementError`, naming what it asked for and what the cluster has free.

Deliberate simplifications: one GPU and one CPU per rank; a pack too large for every node is split into
single-rank bundles (placed as close together as Ray manages) rather than refused.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass
from typing import Any

from rlkit.config.components import PolicyConfig
from rlkit.errors import RLKitError


class PlacementError(RLKitError, RuntimeError):
    """A worker group whose ranks the Ray cluster cannot place (in time): what is missing and how to fix it."""


@dataclass(frozen=True)
class RankPlacement:
    """Where one rank runs: its placement-group bundle, its node, and its OpenMP thread count there."""

    rank: int
    bundle: int
    node_id: str
    node_ip: str
    threads: int

    @property
    def node(self) -> str:
        """The node in words, for messages: its IP and the start of its Ray node id."""
        return f"node {self.node_ip} (id {self.node_id[:8]})"


def pack_size(cfg: PolicyConfig, world_size: int) -> int:
    """Consecutive ranks that should share a node: the backend's rule (Megatron: its tensor- or expert-parallel
    group); 1 where ranks only split rows."""
    return cfg.backend_section.ranks_per_node(world_size)


def _alive_nodes() -> list[dict[str, Any]]:
    import ray

    return [n for n in ray.nodes() if n.get("Alive")]


def rank_resources() -> dict[str, float]:
    """What one rank reserves: a CPU, and a GPU when the cluster has any."""
    import ray

    return {"CPU": 1.0, "GPU": 1.0} if ray.cluster_resources().get("GPU", 0) > 0 else {"CPU": 1.0}


def _describe(resources: dict[str, float]) -> str:
    return ", ".join(f"{k}={v:g}" for k, v in sorted(resources.items()) if k in ("CPU", "GPU") or v > 0 and
                     not k.startswith(("node:", "memory", "object_store")))


def _not_placed(bundles: list[dict[str, float]], timeout_s: float) -> PlacementError:
    import ray

    per_node = "; ".join(f"{n['NodeManagerAddress']} (id {n['NodeID'][:8]}): {_describe(n['Resources'])}"
                         for n in _alive_nodes())
    total = dict(sum((Counter(b) for b in bundles), Counter()))
    free = ray.available_resources()
    missing = {k: v - free.get(k, 0) for k, v in total.items() if free.get(k, 0) < v}
    return PlacementError(
        f"the policy workers could not be placed within {timeout_s:g} s: they need {len(bundles)} bundle(s) "
        f"{bundles[0]} ({_describe(total)} in all), the cluster has {_describe(free) or 'nothing'} free "
        f"(missing: {_describe(missing) or 'none in total, but no node holds a bundle'}); its nodes have {per_node}. "
        "Free resources (close other sessions or groups), add nodes, use fewer policy.num_workers, or wait longer "
        "with policy.ray_cfg.placement_timeout_s")


def place_ranks(cfg: PolicyConfig, world_size: int, timeout_s: float) -> tuple[Any, list[RankPlacement]]:
    """A ready placement group for ``world_size`` ranks and where each rank goes, in rank order. Raises
    :class:`PlacementError` when it is not placed within ``timeout_s`` (the pending group is removed)."""
    from ray.util.placement_group import placement_group, placement_group_table, remove_placement_group

    per_rank = rank_resources()
    nodes = _alive_nodes()
    pack = pack_size(cfg, world_size)
    if pack > 1 and not any(all(n["Resources"].get(k, 0) >= v * pack for k, v in per_rank.items()) for n in nodes):
        pack = 1  # no node holds a whole tensor-parallel group: spread it, as close as Ray packs it
    bundles = [{k: v * pack for k, v in per_rank.items()} for _ in range(world_size // pack)]
    group = placement_group(bundles, strategy="PACK")
    if not group.wait(timeout_seconds=timeout_s):
        error = _not_placed(bundles, timeout_s)
        remove_placement_group(group)
        raise error
    bundle_nodes = placement_group_table(group)["bundles_to_node_id"]
    node_order = list(dict.fromkeys(bundle_nodes[b] for b in range(len(bundles))))  # first use order
    ordered = sorted(range(len(bundles)), key=lambda b: (node_order.index(bundle_nodes[b]), b))
    info = {n["NodeID"]: n for n in nodes}
    ranks_on = {node: pack * sum(1 for b in ordered if bundle_nodes[b] == node) for node in node_order}
    placements = []
    for b in ordered:
        node = bundle_nodes[b]
        cpus = info.get(node, {}).get("Resources", {}).get("CPU", 1)
        threads = max(1, int(cpus) // ranks_on[node])
        ip = info.get(node, {}).get("NodeManagerAddress", "?")
        for _ in range(pack):
            placements.append(RankPlacement(len(placements), b, node, ip, threads))
    return group, placements
