"""A Ray worker group that presents the Policy protocol: one actor per rank, driven from the notebook.

Why Ray: a notebook kernel is one process, and Megatron's parallel state is process-global, so more than
one training rank means more processes. Ray starts them (or finds them on a cluster), carries tensors and
exceptions back, and lets the notebook kill them when something hangs. Each actor builds the same
in-process policy a single-rank session uses (the config's backend: :mod:`rlkit.policy.backends`), with
torch.distributed initialised from ``MASTER_ADDR``/``RANK``/``WORLD_SIZE`` (gloo on CPU, NCCL on GPU), so the
group adds no numerics of its own:

* **Data parallelism.** A batch is cut into contiguous row slices, one per data-parallel rank; the
  tensor-parallel ranks of one data-parallel group get the same slice. Each rank normalises its loss by
  counts over the *global* batch and gradients are summed over the data-parallel group inside the policy,
  so one step equals the single-process step on the whole batch. Training needs the rows to divide
  evenly; scoring pads the last slice with copies of the last row and drops them again.
* **Export.** Gathering a full tensor from tensor-parallel shards is a collective, so every rank advances
  its export generator in step, one fused group per call; rank 0 sends the group. The notebook holds at
  most one group beyond the model.
* **Errors.** A worker's exception comes back as :class:`WorkerError` carrying the worker's traceback.
  When one rank fails while the others are blocked in a collective, the group is marked broken (the ranks
  are out of step) and only ``close()`` is accepted; ``close()`` kills the actors, so it works even then.
* **Checkpoints.** ``save_state``/``load_state`` run on every rank together: each writes or reads its own
  shard of one distributed checkpoint (:mod:`rlkit.policy.state`), so nothing passes through the driver.
  The folder (a relative one is resolved on the driver) must be one every rank can reach (one machine, or a
  shared file system).
* **A cluster.** The same code runs on one machine and on a Ray cluster of several: the ranks are placed by
  a placement group sized from the cluster, tensor-parallel groups packed per node
  (:mod:`rlkit.cluster_placement`); the workers' code and variables come from :mod:`rlkit.cluster`; the model
  folder is checked on every node and shipped where missing (:mod:`rlkit.cluster_model`); rank 0 hosts the
  rendezvous store on a port the OS picks; a refit can send the weights from rank 0 straight to the engine
  (:meth:`RayPolicyGroup.on_ranks`, used by :class:`rlkit.weight_sync.RanksBroadcastWeightSync`); a worker's
  output reaches the driver prefixed with its rank (when Ray was joined by address), and a failure names its node.

Deliberate simplifications: every call waits for all ranks (no overlap of rollout and training); a Ctrl-C
during a remote call waits for the workers to finish it (they cannot be stopped mid-collective), so a
train step that completed remotely counts.
"""

from __future__ import annotations

import dataclasses
import os
import re
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Iterator, Mapping, Optional

import torch
import torch.distributed as dist
from torch import Tensor

from rlkit.config.components import PolicyConfig
from rlkit.cluster import package_versions, version_mismatches, worker_env_vars
from rlkit.cluster_model import folder_problem, model_folder_on_ranks, write_cached_folder
from rlkit.cluster_placement import RankPlacement, place_ranks, rank_resources
from rlkit.distributed import ensure_ray as start_ray
from rlkit.distributed import host_store, join_store
from rlkit.errors import ConfigError, RLKitError
from rlkit.models.factory import read_hf_config
from rlkit.policy.base import LossFn, TokenLogprobs, TrainStepResult
from rlkit.policy.architecture import Architecture
from rlkit.trajectories import Trajectories
from rlkit.weights import HFGroup

FAILURE_GRACE_S = 15.0  # after one rank fails, how long the others get to finish before the group is broken


class WorkerError(RLKitError, RuntimeError):
    """An exception (or death) inside a policy worker, with the worker's traceback in the message.

    ``cause`` is the worker's original exception when Ray could bring it back, else None.
    """

    def __init__(self, message: str, cause: Optional[BaseException] = None, rank: Optional[int] = None):
        super().__init__(message)
        self.cause = cause
        self.rank = rank


@dataclass(frozen=True)
class RankInfo:
    """Where one actor sits in the layout, and what its process looks like."""

    rank: int
    dp_rank: int
    dp_size: int
    leader: bool  # first rank of its data-parallel group: sends that group's results
    pid: int
    omp_num_threads: Optional[str]
    torch_threads: int
    node_id: str  # Ray's id of the node this rank runs on


class _PolicyWorker:
    """The actor: one rank's policy. Methods mirror the Policy protocol on this rank's share of the batch."""

    def __init__(self, rank: int, threads: int, niceness: int):
        if os.getpriority(os.PRIO_PROCESS, 0) < niceness:  # started by a Ray launched at raised priority
            os.setpriority(os.PRIO_PROCESS, 0, niceness)
        torch.set_num_threads(threads)
        self.rank = rank
        self.policy = None
        self._export: Optional[Iterator[HFGroup]] = None
        self._store = None  # rank 0: the rendezvous store it hosts
        self.kept: dict[str, Any] = {}  # what code run by run() keeps on this rank (rank 0: its weight sync)

    def __repr__(self) -> str:  # Ray prefixes each line the actor prints with this
        return f"rank {self.rank}"

    versions = staticmethod(package_versions)
    folder_problem = staticmethod(folder_problem)  # the model folder checks of rlkit.cluster_model, on this node
    write_cached_folder = staticmethod(write_cached_folder)

    def host_rendezvous(self, world_size: int) -> tuple[str, int]:
        """Rank 0: start the process group's rendezvous store (on a port the OS picks) and say where it is."""
        self._store, address = host_store(world_size)
        return address

    def build(self, cfg: PolicyConfig, seed: int, rank: int, world_size: int, master: tuple[str, int]) -> RankInfo:
        import ray

        os.environ.update(RANK=str(rank), WORLD_SIZE=str(world_size), LOCAL_RANK="0")
        store = self._store if rank == 0 else join_store(*master, world_size)
        dist.init_process_group("nccl" if torch.cuda.is_available() else "gloo", store=store, rank=rank,
                                world_size=world_size)
        from rlkit.policy.backends import in_process_policy

        p = self.policy = in_process_policy(cfg, seed)
        return RankInfo(rank, p.dp_rank, p.dp_size, p.leader, os.getpid(), os.environ.get("OMP_NUM_THREADS"),
                        torch.get_num_threads(), ray.get_runtime_context().get_node_id())

    def call(self, method: str, *args: Any, keep: bool = True, **kwargs: Any) -> Any:
        """``policy.method(*args, **kwargs)``; the result only when ``keep`` (the others return None)."""
        out = getattr(self.policy, method)(*args, **kwargs)
        return out if keep else None

    def get_version(self) -> int:
        return self.policy.version

    def set_version(self, version: int) -> None:
        self.policy.version = version

    def export_begin(self) -> None:
        self._export = self.policy.export_hf_groups()

    def export_next(self, keep: bool) -> Optional[HFGroup] | bool:
        """The next HF group (copied, so a view does not drag its whole storage along), True on ranks
        that do not send, None when the export is done."""
        try:
            group = next(self._export)
        except StopIteration:
            self._export = None
            return None
        return [(n, t.detach().clone()) for n, t in group] if keep else True

    def export_end(self) -> None:
        self._export = None

    def run(self, fn: Callable, *args: Any) -> Any:
        """``fn(kept, policy, rank, *args)``: code of a layer above the policy (a weight sync's rank side) on this
        rank, with ``kept``, a dict this rank keeps for it between calls."""
        return fn(self.kept, self.policy, self.rank, *args)

    def close(self) -> None:
        if self.policy is not None:
            self.policy.close()
            self.policy = None


def _on_every_rank(method: str) -> Callable:
    """A :class:`RayPolicyGroup` method: the policy's ``method`` on every rank, rank 0's result."""
    def call(self: "RayPolicyGroup", *args: Any) -> Any:
        return self._call_all(method, *args)

    call.__name__ = method
    return call


class RayPolicyGroup:
    """``world_size`` policy ranks in Ray actors behind the Policy protocol (see the module docstring)."""

    returns_step_logprobs = False  # each rank's train step sees its slice of the rows only

    def __init__(self, cfg: PolicyConfig, world_size: int, seed: int = 0, ray_address: Optional[str] = None):
        # a relative folder means the driver's: each node's Ray may have been started in another directory
        cfg = cfg.model_copy(update={"model_name": str(Path(cfg.model_name).resolve())})
        self._cfg = cfg
        self.world_size = world_size
        self.arch = Architecture.from_hf_folder(cfg.model_name)
        self._version = 0
        self._workers: list[Any] = []
        self.placements: list[RankPlacement] = []
        self._placement_group = None
        self._started_ray = False
        self._broken: Optional[str] = None
        self._closed = False
        problems = cfg.backend_section.model_problems(cfg, read_hf_config(cfg.model_name), world_size)
        if problems:
            raise ConfigError(problems)
        try:
            self._start(cfg, seed, ray_address)
        except BaseException:
            self.close()
            raise

    def _start(self, cfg: PolicyConfig, seed: int, ray_address: Optional[str]) -> None:
        import ray
        from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

        self._started_ray = start_ray(ray_address, num_cpus=max(self.world_size, os.cpu_count() or 1),
                                      modules=cfg.ray_cfg.py_modules)
        self._placement_group, self.placements = place_ranks(cfg, self.world_size, cfg.ray_cfg.placement_timeout_s)
        niceness = os.getpriority(os.PRIO_PROCESS, 0)
        num_gpus = rank_resources().get("GPU", 0)
        for p in self.placements:
            options = dict(
                num_cpus=1, num_gpus=num_gpus,
                scheduling_strategy=PlacementGroupSchedulingStrategy(self._placement_group, p.bundle),
                runtime_env={"env_vars": worker_env_vars(p.threads)})
            self._workers.append(ray.remote(_PolicyWorker).options(**options).remote(p.rank, p.threads, niceness))
        self._check_versions()
        nodes = [p.node for p in self.placements]
        paths = model_folder_on_ranks(Path(cfg.model_name), self._workers, nodes, cfg.ray_cfg.ship_model_max_mb,
                                      self._gather)
        master = self._gather([self._workers[0].host_rendezvous.remote(self.world_size)], "rendezvous")[0]
        self.ranks: list[RankInfo] = self._gather(
            [w.build.remote(cfg.model_copy(update={"model_name": path}), seed, r, self.world_size, master)
             for r, (w, path) in enumerate(zip(self._workers, paths))], "build")
        self.dp_size = self.ranks[0].dp_size

    def _check_versions(self) -> None:
        """Every node runs the driver's versions of the packages rlkit needs (they are not shipped)."""
        driver = package_versions()
        found = self._gather([w.versions.remote() for w in self._workers], "version check")
        problems = [line for p, versions in zip(self.placements, found)
                    for line in version_mismatches(driver, versions, f"rank {p.rank} ({p.node})")]
        if problems:
            raise ConfigError([f"packages differ between the driver and a worker: {line}; install the driver's "
                               "versions on every node" for line in problems])

    # ---- calling the workers ----------------------------------------------------------------------
    def _check_usable(self) -> None:
        if self._closed:
            raise WorkerError("this policy group is closed; build a new one")
        if self._broken is not None:
            raise WorkerError(f"this policy group is broken ({self._broken}); call close() and build a new one")

    def _gather(self, refs: list, what: str) -> list:
        """Results of ``refs`` (one per rank, in rank order); the first failure raises WorkerError."""
        import ray

        rank_of = {ref: r for r, ref in enumerate(refs)}
        pending = list(refs)
        try:
            while pending:
                done, pending = ray.wait(pending, num_returns=1)
                for ref in done:
                    try:
                        ray.get(ref)
                    except Exception as e:
                        raise self._failure(e, rank_of[ref], what, pending) from e
        except KeyboardInterrupt:
            # The ranks cannot be stopped mid-collective: let them finish this call so they stay in step.
            if pending:
                ray.wait(pending, num_returns=len(pending))
            raise
        return ray.get(list(refs))

    def _failure(self, error: Exception, rank: int, what: str, pending: list) -> WorkerError:
        import ray
        from ray.exceptions import RayActorError, RayTaskError

        where = f" on {self.placements[rank].node}" if rank < len(self.placements) else ""
        if isinstance(error, RayActorError):  # a dead rank: the group is broken, no point waiting for the rest
            self._broken = f"rank {rank} died in {what}(){where}"
            return WorkerError(f"policy worker rank {rank} of {self.world_size} died in {what}(){where}: {error}",
                               error, rank)
        if pending:
            _, still_running = ray.wait(pending, num_returns=len(pending), timeout=FAILURE_GRACE_S)
            if still_running:
                self._broken = f"rank {rank} failed in {what}() while other ranks waited in a collective"
        if isinstance(error, RayTaskError):
            cause = error.cause if isinstance(error.cause, BaseException) else None
            trace = re.sub(r"\x1b\[[0-9;]*m", "", getattr(error, "traceback_str", None) or str(error))
            return WorkerError(f"policy worker rank {rank} of {self.world_size} failed in {what}(){where}; the worker's "
                               f"traceback (most recent call last):\n{trace}", cause, rank)
        return WorkerError(f"policy worker rank {rank} of {self.world_size}: {what}() failed{where}: {error!r}",
                           error, rank)

    def _call_all(self, method: str, *args: Any, **kwargs: Any) -> Any:
        """``method`` on every rank with the same arguments; rank 0's result."""
        self._check_usable()
        refs = [w.call.remote(method, *args, keep=r == 0, **kwargs) for r, w in enumerate(self._workers)]
        return self._gather(refs, method)[0]

    def _call_sliced(self, method: str, parts: list, *args: Any, unpack: bool = False, **kwargs: Any) -> list:
        """``method(part, *args)`` (``method(*part, *args)`` with ``unpack``) on every rank, each data-parallel
        group getting its part (put once, shared by its tensor-parallel ranks); the group leaders' results
        in data-parallel order."""
        import ray

        self._check_usable()
        part_refs = [[ray.put(x) for x in p] if unpack else [ray.put(p)] for p in parts]
        refs = [w.call.remote(method, *part_refs[info.dp_rank], *args, keep=info.leader, **kwargs)
                for w, info in zip(self._workers, self.ranks)]
        results = self._gather(refs, method)
        by_dp = {info.dp_rank: out for info, out in zip(self.ranks, results) if info.leader}
        return [by_dp[d] for d in range(self.dp_size)]

    # ---- the Policy contract ----------------------------------------------------------------------
    @property
    def version(self) -> int:
        """Optimizer steps taken (rank 0's count; setting it sets every rank's)."""
        return self._version

    @version.setter
    def version(self, value: int) -> None:
        self._check_usable()
        self._gather([w.set_version.remote(value) for w in self._workers], "set_version")
        self._version = value

    def _split_rows(self, batch: Trajectories) -> list[Trajectories]:
        b, dp = batch.batch_size, self.dp_size
        if b % dp:
            raise ValueError(f"a batch of {b} rows does not split evenly over {dp} data-parallel ranks; make "
                             f"policy.train_global_batch_size (or the samples per step) a multiple of {dp}")
        size = b // dp
        return [batch.select(slice(d * size, (d + 1) * size)) for d in range(dp)]

    def logprobs(self, input_ids: Tensor, attention_mask: Tensor, *, with_entropy: bool = False,
                 scored: Optional[Tensor] = None) -> TokenLogprobs:
        """Per-token logprobs (and entropy) [B, T]: rows split over the data-parallel ranks, results in order."""
        return self._logprobs("logprobs", input_ids, attention_mask, with_entropy=with_entropy)

    def reference_logprobs(self, input_ids: Tensor, attention_mask: Tensor, *,
                           scored: Optional[Tensor] = None) -> TokenLogprobs:
        return self._logprobs("reference_logprobs", input_ids, attention_mask)

    def _logprobs(self, method: str, input_ids: Tensor, attention_mask: Tensor, **kwargs: Any) -> TokenLogprobs:
        """(``scored`` is not sent: the ranks score every position, which the contract allows.)"""
        b, dp = input_ids.shape[0], self.dp_size
        size = -(-b // dp)
        # the rows, then copies of the last row, so that every rank runs as many forward passes
        rows = torch.arange(size * dp).clamp(max=b - 1)
        parts = list(zip(input_ids[rows].split(size), attention_mask[rows].split(size)))
        results: list[TokenLogprobs] = self._call_sliced(method, parts, unpack=True, **kwargs)
        logprobs = torch.cat([r.logprobs for r in results])[:b]
        entropy = None if results[0].entropy is None else torch.cat([r.entropy for r in results])[:b]
        return TokenLogprobs(logprobs, entropy)

    def train_step(self, batch: Trajectories, loss_fn: LossFn, *, return_logprobs: bool = False) -> TrainStepResult:
        """One optimizer step on every rank, each on its data-parallel slice of ``batch``."""
        if return_logprobs:
            raise ValueError("a Ray worker group's ranks each see a slice of the rows, so a train step returns no "
                             "logprobs (returns_step_logprobs is False): run the logprobs stage first")
        t0 = time.perf_counter()
        parts = self._split_rows(batch)
        try:
            result: TrainStepResult = self._call_sliced("train_step", parts, loss_fn)[0]
        except KeyboardInterrupt:  # the workers finished the call (see _gather): did it update?
            self._version = self._gather([self._workers[0].get_version.remote()], "version")[0]
            raise
        self._version = result.version
        return dataclasses.replace(result, timings=dict(result.timings, train_step_group=time.perf_counter() - t0))

    def evaluate_loss(self, batch: Trajectories, loss_fn: LossFn) -> dict[str, float]:
        return self._call_sliced("evaluate_loss", self._split_rows(batch), loss_fn)[0]

    def export_hf_groups(self) -> Iterator[HFGroup]:
        """HF-named full tensors from rank 0, one fused group per round trip (all ranks gather in step)."""
        self._check_usable()
        self._gather([w.export_begin.remote() for w in self._workers], "export_hf_groups")
        try:
            while True:
                refs = [w.export_next.remote(r == 0) for r, w in enumerate(self._workers)]
                group = self._gather(refs, "export_hf_groups")[0]
                if group is None:
                    return
                yield group
        finally:
            if self._broken is None and not self._closed:
                self._gather([w.export_end.remote() for w in self._workers], "export_hf_groups")

    def on_ranks(self, fn: Callable, *args: Any) -> Any:
        """``fn(kept, policy, rank, *args)`` on every rank together (``kept``: a dict each rank keeps for ``fn``'s
        module between calls); rank 0's result. How a weight sync sends from rank 0 straight to an engine
        (:class:`rlkit.weight_sync.RanksBroadcastWeightSync`) without the policy importing it."""
        self._check_usable()
        return self._gather([w.run.remote(fn, *args) for w in self._workers], getattr(fn, "__name__", "run"))[0]

    def hf_state_dict(self) -> dict[str, Tensor]:
        return {name: t for group in self.export_hf_groups() for name, t in group}

    def load_hf_state(self, hf: Mapping[str, Tensor]) -> None:
        """Load HF-named full tensors on every rank (each keeps its shard)."""
        import ray

        self._call_all("load_hf_state", ray.put(dict(hf)))

    set_reference_to_current = _on_every_rank("set_reference_to_current")
    keep_reference = _on_every_rank("keep_reference")
    reset_optimizer = _on_every_rank("reset_optimizer")
    reset_adapters = _on_every_rank("reset_adapters")
    offload_optimizer_state = _on_every_rank("offload_optimizer_state")
    release_gradient_buffers = _on_every_rank("release_gradient_buffers")
    restore_optimizer_state = _on_every_rank("restore_optimizer_state")

    def release_frozen_base(self) -> int:
        """Every rank frees its shard of the frozen base until its next forward pass, export or HF import reads it
        back (:meth:`rlkit.policy.in_process.InProcessPolicy.release_frozen_base`); rank 0's bytes freed."""
        return self._call_all("release_frozen_base")

    def reference_residency(self) -> str:
        return self._call_all("reference_residency") + " (rank 0)"

    @property
    def releases_base_while_generating(self) -> bool:
        return self._cfg.lora_cfg.releases_base

    def save_state(self, folder: Path) -> None:
        """Every rank writes its shard of one distributed checkpoint into ``folder`` (see the module docstring)."""
        self._call_all("save_state", Path(folder).resolve())

    def load_state(self, folder: Path) -> None:
        """Every rank reads its shard; a checkpoint of another layout is refused before anything loads."""
        self._call_all("load_state", Path(folder).resolve())
        self._version = self._gather([self._workers[0].get_version.remote()], "version")[0]

    def close(self) -> None:
        """Stop the workers (killed, so this works even when one hangs in a collective) and the Ray
        cluster if this group started it. Safe to call twice."""
        if self._closed:
            return
        self._closed = True
        import ray
        from ray.util.placement_group import remove_placement_group

        if self._workers:
            if self._broken is None:
                refs = [w.close.remote() for w in self._workers]
                ray.wait(refs, num_returns=len(refs), timeout=30)
            for w in self._workers:
                ray.kill(w)
            self._workers = []
        if self._placement_group is not None:
            remove_placement_group(self._placement_group)
            self._placement_group = None
        if self._started_ray:
            ray.shutdown()
            self._started_ray = False

    def __repr__(self) -> str:
        a = self.arch
        if self._closed:
            return f"RayPolicyGroup({a.family}, closed)"
        backend = self._cfg.backend_section
        state = f", BROKEN: {self._broken}" if self._broken else ""
        return (f"RayPolicyGroup({a.family}, {a.num_layers}x{a.hidden_size}, {self.world_size} workers: {backend.title} "
                f"{backend.layout_words(self.world_size)}, version={self._version}{state})")
