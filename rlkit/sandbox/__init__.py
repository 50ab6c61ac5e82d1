"""The OS sandbox for untrusted Python (a policy's tool call): each call in new user, PID, mount, network, IPC
and UTS namespaces, under resource limits, so that one line of it cannot stop the run, forge a reward or read a
secret.

:mod:`rlkit.sandbox.run` runs a program and says which guarantee comes from where; :mod:`rlkit.sandbox.kernel`
is what it asks of the kernel (the isolating command, the program's file system, a cgroup per call);
:mod:`rlkit.sandbox.child` is the side that runs inside the namespaces; :mod:`rlkit.sandbox.attacks` and
:mod:`rlkit.sandbox.check` are the attack catalogue and ``rlkit sandbox-check``, which runs it.

Its own package, below ``envs/`` (whose ``PythonTool`` calls it): it imports nothing of rlkit but
:mod:`rlkit.errors`, and ``rlkit sandbox-check`` loads it without the rest of rlkit.
"""

from rlkit.sandbox.kernel import SandboxMode
from rlkit.sandbox.run import (SandboxLimits, SandboxResult, SandboxUnavailableError, describe_backend,
                               resolve_backend, run_python)

__all__ = ["SandboxLimits", "SandboxMode", "SandboxResult", "SandboxUnavailableError", "describe_backend",
           "resolve_backend", "run_python"]
