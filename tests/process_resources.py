"""Counts of what a process holds, for tests that a session's close() releases all of it.

Threads are counted as the kernel's tasks (/proc/self/task: the C++ threads of gloo and of the rendezvous
store too, which ``threading`` does not see) and by name; file descriptors in /proc/self/fd.
"""

from __future__ import annotations

import gc
import os
import resource
import threading

# Thread names of a torch.distributed gloo group (two workers, a transport loop) and of its rendezvous store
PROCESS_GROUP_THREADS = {"pt_gloo_runloop", "gloo_tcp_loop", "pt_tcpstore_uv"}


def thread_names() -> list[str]:
    """Every thread of this process, by the name the kernel knows it by."""
    names = []
    for task in os.listdir("/proc/self/task"):
        try:
            with open(f"/proc/self/task/{task}/comm") as f:
                names.append(f.read().strip())
        except OSError:  # the thread ended between listing and reading
            pass
    return names


def process_counts() -> dict[str, int]:
    """Threads (kernel tasks and Python threads), process-group threads and open file descriptors, after a
    garbage collection so that only what something still holds is counted."""
    gc.collect()
    names = thread_names()
    return {"threads": len(names), "python_threads": threading.active_count(),
            "group_threads": sum(name in PROCESS_GROUP_THREADS for name in names),
            "fds": len(os.listdir("/proc/self/fd"))}


def rss_mib() -> float:
    """Resident memory of this process, in MiB."""
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * resource.getpagesize() / 2**20
