"""Small process-level helpers shared by the Ray-backed components (generator actor, policy workers).

``ensure_ray`` joins the Ray instance this process already has, or starts a local one, and says whether it
started it: the component that started Ray shuts it down in its ``close()``, the others leave it alone.
Joining a cluster by address brings the workers' output to this process (Ray prefixes each line with the
actor, which for a policy worker names its rank); a local instance keeps it in Ray's log files.
``host_store`` starts a process group's rendezvous store on a port the OS picks while binding it, so no other
process can take the port between choosing and use (the race of "find a free port, release it, pass it on").
``pair_group`` opens a dedicated two-rank process group between two processes without touching the default
process group (vLLM and Megatron each use their own), so a weight broadcast cannot collide with them.
The environment of Ray's workers (code, variables) is built in :mod:`rlkit.cluster`.
"""

from __future__ import annotations

import contextlib
import datetime
import os
import warnings
from typing import Iterable, Optional

import torch.distributed as dist

RAY_START_ATTEMPTS = 3  # a loaded machine can miss the raylet's fixed start-up deadline; retry


def ensure_ray(address: Optional[str] = None, num_cpus: Optional[int] = None, modules: Iterable[str] = ()) -> bool:
    """Connect to Ray (``address``, ``$RAY_ADDRESS``, or the one this process joined) or start a local one,
    with :func:`rlkit.cluster.job_runtime_env` (rlkit, the driver's own modules and ``modules`` shipped to
    every worker). Returns True when this call started it (its owner shuts it down).

    Ray 2.60's raylet gives its agents a fixed 15 s to report their ports (ray-project/ray#65983); on a
    loaded machine their Python start-up misses it and the node start fails. On an oversubscribed machine
    (load above twice the cores) and on retries, Ray's processes start at a raised CPU priority where the
    OS allows it (the policy actors drop it again).
    """
    import ray

    from rlkit.cluster import job_runtime_env

    if ray.is_initialized():
        if modules:
            warnings.warn(f"Ray was started before rlkit could add {list(modules)} to its job: workers on other "
                          "machines will not import them; start Ray with ray.init(runtime_env=rlkit.cluster."
                          "job_runtime_env([...])) or let rlkit start it", stacklevel=2)
        return False
    runtime_env = job_runtime_env(modules)
    address = address or os.environ.get("RAY_ADDRESS")  # Ray's own convention for "join this cluster"
    if address:  # the workers run on other machines: show their output here
        ray.init(address=address, log_to_driver=True, runtime_env=runtime_env)
        return False
    for attempt in range(1, RAY_START_ATTEMPTS + 1):
        try:
            oversubscribed = os.getloadavg()[0] > 2 * (os.cpu_count() or 1)
            with raised_priority(enabled=attempt > 1 or oversubscribed):
                ray.init(num_cpus=num_cpus, include_dashboard=False, log_to_driver=False, runtime_env=runtime_env)
            return True
        except Exception as e:  # Ray raises a bare Exception when its node misses the start-up deadline
            ray.shutdown()
            if "timed out during startup" not in str(e) or attempt == RAY_START_ATTEMPTS:
                raise RuntimeError(f"could not start a local Ray cluster ({attempt} attempt(s)): {e}. On a "
                                   "heavily loaded machine Ray's agents can miss the raylet's start-up deadline; "
                                   "start one with `ray start --head` and pass its address") from e
    raise AssertionError("unreachable")


@contextlib.contextmanager
def raised_priority(enabled: bool, boost: int = 10):
    """Processes started inside the block inherit this thread's niceness lowered by ``boost`` (if allowed)."""
    before = os.getpriority(os.PRIO_PROCESS, 0)
    try:
        if enabled:
            os.setpriority(os.PRIO_PROCESS, 0, before - boost)
    except PermissionError:
        enabled = False
    try:
        yield
    finally:
        if enabled:
            os.setpriority(os.PRIO_PROCESS, 0, before)


def node_ip() -> str:
    """This node's IP address as Ray sees it when Ray is up, else the loopback address."""
    try:
        import ray

        if ray.is_initialized():
            return ray.util.get_node_ip_address()
    except ImportError:  # pragma: no cover - Ray is optional for single-process use
        pass
    return "127.0.0.1"


def host_store(world_size: int, timeout_s: float = 600.0):
    """The rendezvous store of a ``world_size``-rank group, hosted by this process (rank 0) on a port the OS
    picks while binding it; returns the store and ``(host, port)`` for the other ranks."""
    host = node_ip()
    store = dist.TCPStore(host, 0, world_size, is_master=True, timeout=datetime.timedelta(seconds=timeout_s),
                          wait_for_workers=False)
    return store, (host, store.port)


def join_store(host: str, port: int, world_size: int, timeout_s: float = 600.0):
    """A client of the rendezvous store that rank 0 hosts at ``host:port`` (see :func:`host_store`)."""
    return dist.TCPStore(host, port, world_size, is_master=False, timeout=datetime.timedelta(seconds=timeout_s))


def pair_group_on(store, rank: int, backend: str = "gloo", timeout_s: float = 600.0):
    """A two-rank process group over ``store``, separate from the default group; blocks until both joined."""
    if backend == "nccl":  # GPU machines: the same calls, NCCL transport
        return dist.ProcessGroupNCCL(store, rank, 2)
    return dist.ProcessGroupGloo(store, rank, 2, datetime.timedelta(seconds=timeout_s))


def pair_group(host: str, port: int, rank: int, backend: str = "gloo", timeout_s: float = 600.0):
    """A two-rank process group whose rendezvous store rank 0 hosts at ``host:port`` (rank 0 passes the port
    of a store it already hosts: :func:`host_store`), separate from the default group. Both ranks must call
    this; each blocks until the other has joined."""
    if rank == 0:
        raise ValueError("rank 0 hosts the store: open its end with host_store(2) and pair_group_on(store, 0)")
    store = join_store(host, port, 2, timeout_s)
    return store, pair_group_on(store, rank, backend, timeout_s)


def start_broadcast(group, tensor, root: int = 0):
    """Start broadcasting ``tensor`` from ``root`` over ``group`` (in place on the receivers); returns the
    work handle, whose ``wait()`` blocks until this rank's part is done."""
    opts = dist.BroadcastOptions()
    opts.rootRank = root
    return group.broadcast([tensor], opts)


def broadcast(group, tensor, root: int = 0) -> None:
    start_broadcast(group, tensor, root).wait()
