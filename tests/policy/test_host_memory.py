"""Freed host memory goes back to the OS (rlkit.policy.host_memory): glibc's mmap threshold fixed at 1 MiB."""

import os
import subprocess
import sys
import textwrap

import pytest

from rlkit.policy.host_memory import return_freed_memory_to_os

# Frees a 16 MiB tensor (glibc then raises its mmap threshold to 16 MiB), allocates 256 MiB as 2 MiB tensors with a
# small tensor kept alive after each (so the heap cannot be trimmed from its top), frees the 2 MiB ones, and prints
# the resident MiB that stayed.
PROGRAM = textwrap.dedent("""
    import os, sys, torch
    if sys.argv[1] == "fixed":
        from rlkit.policy.host_memory import return_freed_memory_to_os
        assert return_freed_memory_to_os()
    def rss_mib():
        return int(open("/proc/self/statm").read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**20
    big = torch.ones(4 << 20)  # 16 MiB
    del big
    before = rss_mib()
    blocks, pins = [], []
    for _ in range(128):
        blocks.append(torch.ones(512 << 10))  # 2 MiB
        pins.append(torch.ones(16 << 10))  # 64 KiB, below either threshold: on the heap, after the block
    del blocks
    print(rss_mib() - before)
""")


def _kept_mib(mode: str) -> float:
    out = subprocess.run([sys.executable, "-c", PROGRAM, mode], capture_output=True, text=True, check=True)
    return float(out.stdout.split()[-1])


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc's malloc")
def test_freed_tensors_leave_the_process_once_the_threshold_is_fixed():
    assert return_freed_memory_to_os()
    assert _kept_mib("default") > 200  # glibc's own behaviour: the freed 2 MiB blocks stay resident
    assert _kept_mib("fixed") < 20


def test_glibcs_own_variable_keeps_the_threshold_the_user_chose():
    program = "from rlkit.policy.host_memory import return_freed_memory_to_os as r; print(r())"
    out = subprocess.run([sys.executable, "-c", program], capture_output=True, text=True, check=True,
                         env={**os.environ, "MALLOC_MMAP_THRESHOLD_": "33554432"})
    assert out.stdout.split()[-1] == "False"
