"""``policy.return_freed_host_memory`` (rlkit.host_memory): glibc's mmap threshold fixed at 1 MiB, so that
freed host memory leaves the process; off by default."""

import os
import subprocess
import sys
import textwrap

import pytest

# Frees a 16 MiB tensor (glibc then raises its mmap threshold to 16 MiB, as after a first train step), allocates
# 256 MiB as 2 MiB tensors, each followed by a 64 KiB one kept alive (so the heap cannot shrink from its top), frees
# the 2 MiB ones, and prints the resident MiB that stayed. With "fixed", the threshold is fixed first.
PROGRAM = textwrap.dedent("""
    import os, sys, torch
    if sys.argv[1] == "fixed":
        from rlkit.host_memory import return_freed_memory_to_os
        assert return_freed_memory_to_os()
    def rss_mib():
        return int(open("/proc/self/statm").read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**20
    big = torch.ones(4 << 20)
    del big
    before = rss_mib()
    blocks, pins = [], []
    for _ in range(128):
        blocks.append(torch.ones(512 << 10))
        pins.append(torch.ones(16 << 10))
    del blocks
    print(rss_mib() - before)
""")


def _run(program: str, *args: str, **env: str) -> str:
    return subprocess.run([sys.executable, "-c", program, *args], capture_output=True, text=True, check=True,
                          env={**os.environ, **env}).stdout.split()[-1]


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc's malloc")
def test_freed_tensors_leave_the_process_once_the_threshold_is_fixed():
    assert float(_run(PROGRAM, "default")) > 200  # glibc's own behaviour: the freed 2 MiB blocks stay resident
    assert float(_run(PROGRAM, "fixed")) < 20


def test_glibcs_own_variable_keeps_the_threshold_the_user_chose():
    program = "from rlkit.host_memory import return_freed_memory_to_os as r; print(r())"
    assert _run(program, MALLOC_MMAP_THRESHOLD_="33554432") == "False"


@pytest.mark.parametrize("switch", [False, True])
def test_the_policy_switch_fixes_the_threshold_only_when_on(switch, model_factory, monkeypatch):
    from rlkit.config.backends import HFPolicyConfig, MegatronConfig
    from rlkit.config.components import PolicyConfig
    from rlkit import host_memory
    from rlkit.policy.backends import in_process_policy

    calls = []
    monkeypatch.setattr(host_memory, "return_freed_memory_to_os", lambda: calls.append("fixed"))
    cfg = PolicyConfig(model_name=str(model_factory("nano", "qwen2", seed=3, num_key_value_heads=2)),
                       hf_cfg=HFPolicyConfig(enabled=True), megatron_cfg=MegatronConfig(enabled=False),
                       return_freed_host_memory=switch)
    in_process_policy(cfg).close()
    assert calls == (["fixed"] if switch else [])
