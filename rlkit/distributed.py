"""Small process-level helpers shared by the Ray-backed components (generator actor, policy workers).

``ensure_ray`` joins the Ray instance this process already has, or starts a local one, and says whether it
started it: the component that started Ray shuts it down in its ``close()``, the others leave it alone.
``pair_group`` opens a dedicated two-rank process group between two processes without touching the default
process group (vLLM and Megatron each use their own), so a weight broadcast cannot collide with them.
"""

from __future__ import annotations

import contextlib
import datetime
import os
import socket
import sys
from typing import Optional

RAY_START_ATTEMPTS = 3  # a loaded machine can miss the raylet's fixed start-up deadline; retry


def ensure_ray(address: Optional[str] = None, num_cpus: Optional[int] = None) -> bool:
    """Connect to Ray (``address``, ``$RAY_ADDRESS``, or the one this process joined) or start a local one.
    Returns True when this call started it (its owner shuts it down).

    Ray 2.60's raylet gives its agents a fixed 15 s to report their ports (ray-project/ray#65983); on a
    loaded machine their Python start-up misses it and the node start fails. On an oversubscribed machine
    (load above twice the cores) and on retries, Ray's processes start at a raised CPU priority where the
    OS allows it (the policy actors drop it again).
    """
    import ray

    if ray.is_initialized():
        return False
    address = address or os.environ.get("RAY_ADDRESS")  # Ray's own convention for "join this cluster"
    if address:
        ray.init(address=address, log_to_driver=False)
        return False
    for attempt in range(1, RAY_START_ATTEMPTS + 1):
        try:
            oversubscribed = os.getloadavg()[0] > 2 * (os.cpu_count() or 1)
            with _raised_priority(enabled=attempt > 1 or oversubscribed):
                ray.init(num_cpus=num_cpus, include_dashboard=False, log_to_driver=False)
            return True
        except Exception as e:  # Ray raises a bare Exception when its node misses the start-up deadline
            ray.shutdown()
            if "timed out during startup" not in str(e) or attempt == RAY_START_ATTEMPTS:
                raise RuntimeError(f"could not start a local Ray cluster ({attempt} attempt(s)): {e}. On a "
                                   "heavily loaded machine Ray's agents can miss the raylet's start-up deadline; "
                                   "start one with `ray start --head` and pass its address") from e
    raise AssertionError("unreachable")


@contextlib.contextmanager
def _raised_priority(enabled: bool, boost: int = 10):
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


def actor_env(threads: int) -> dict[str, str]:
    """Environment for an actor process: the driver's import path, offline hub settings, ``threads`` OpenMP
    threads (idle ones sleeping), so an actor neither fails to import rlkit nor oversubscribes the cores."""
    path = [p for p in sys.path if p and os.path.isdir(p)]
    if os.getcwd() not in path:
        path.insert(0, os.getcwd())
    env = {"OMP_NUM_THREADS": str(threads), "PYTHONPATH": os.pathsep.join(path)}
    for key in ("HF_HUB_OFFLINE", "HF_DATASETS_OFFLINE", "TRANSFORMERS_OFFLINE", "TOKENIZERS_PARALLELISM",
                "OMP_WAIT_POLICY", "VLLM_CPU_KVCACHE_SPACE"):
        if key in os.environ:
            env[key] = os.environ[key]
    return env


def free_address() -> tuple[str, int]:
    """This node's IP address (as Ray sees it when Ray is up) and a free TCP port on it."""
    host = "127.0.0.1"
    try:
        import ray

        if ray.is_initialized():
            host = ray.util.get_node_ip_address()
    except ImportError:  # pragma: no cover - Ray is optional for single-process use
        pass
    with socket.socket() as s:
        s.bind((host, 0))
        return host, s.getsockname()[1]


def pair_group(host: str, port: int, rank: int, backend: str = "gloo", timeout_s: float = 600.0):
    """A two-rank process group (rank 0 hosts the rendezvous store at ``host:port``), separate from the
    default group. Both ranks must call this; each blocks until the other has joined."""
    import torch.distributed as dist

    timeout = datetime.timedelta(seconds=timeout_s)
    store = dist.TCPStore(host, port, 2, is_master=(rank == 0), timeout=timeout, wait_for_workers=False)
    if backend == "nccl":  # GPU machines: the same calls, NCCL transport
        group = dist.ProcessGroupNCCL(store, rank, 2)
    else:
        group = dist.ProcessGroupGloo(store, rank, 2, timeout)
    return store, group


def start_broadcast(group, tensor, root: int = 0):
    """Start broadcasting ``tensor`` from ``root`` over ``group`` (in place on the receivers); returns the
    work handle, whose ``wait()`` blocks until this rank's part is done."""
    import torch.distributed as dist

    opts = dist.BroadcastOptions()
    opts.rootRank = root
    return group.broadcast([tensor], opts)


def broadcast(group, tensor, root: int = 0) -> None:
    start_broadcast(group, tensor, root).wait()
