"""The name scripts and notebooks import the in-process builder by (the registry: :mod:`rlkit.policy.backends`)."""

from rlkit.policy.backends import in_process_policy  # noqa: F401
