"""Freed host memory goes back to the operating system: glibc's malloc with a fixed mmap threshold.

Why: on the CPU every tensor lives in host memory, allocated by glibc's ``malloc``. Blocks of at least the mmap
threshold are mapped on their own and unmapped when freed; smaller ones come from the heap, whose freed pages stay
in the process. glibc raises that threshold each time a mapped block is freed, up to 32 MiB, so after the first
train step the MiB-sized pieces of a step's activations come from the heap, and the pages they leave behind stay
resident, between steps too. Setting the threshold explicitly turns the raising off (``mallopt(3)``), so blocks
of :data:`MMAP_THRESHOLD_BYTES` or more are unmapped when freed.

The price is CPU: each such block is fresh pages from the kernel, zeroed on first touch, so it is a choice
(``policy.return_freed_host_memory``, off by default) for runs that memory limits; the figures at the tiny and the
Qwen3-0.6B shapes are in docs/measurements.md. glibc's own ``MALLOC_MMAP_THRESHOLD_`` (bytes, set before Python
starts) does the same for a whole process, and wins: rlkit then leaves the threshold as set. Most of the CPU comes
back with ``GLIBC_TUNABLES=glibc.malloc.hugetlb=1`` set before Python starts (mapped blocks in transparent huge
pages: one fault per 2 MiB instead of per 4 KiB).
A no-op where the C library is not glibc; a preloaded allocator (tcmalloc, jemalloc) is not affected.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import functools
import os

M_MMAP_THRESHOLD = -3  # glibc's <malloc.h> parameter number
MMAP_THRESHOLD_BYTES = 1 << 20  # blocks this large or larger are mapped on their own, and unmapped when freed


@functools.cache
def _glibc():
    """glibc, or None under another C library."""
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c"))
    except OSError:
        return None
    return libc if hasattr(libc, "gnu_get_libc_version") else None


def release_freed_heap_pages() -> bool:
    """Hand the free pages inside glibc's heap back to the operating system now (``malloc_trim(0)``), after a
    large release made of blocks under the mmap threshold; True when glibc released any."""
    libc = _glibc()
    return libc is not None and libc.malloc_trim(0) == 1


@functools.cache
def return_freed_memory_to_os() -> bool:
    """Fix glibc's mmap threshold at :data:`MMAP_THRESHOLD_BYTES` for this process (once); True when glibc
    accepted it, False under another C library or where ``MALLOC_MMAP_THRESHOLD_`` chose the threshold already."""
    libc = _glibc()
    if "MALLOC_MMAP_THRESHOLD_" in os.environ or libc is None:
        return False
    return libc.mallopt(M_MMAP_THRESHOLD, MMAP_THRESHOLD_BYTES) == 1
