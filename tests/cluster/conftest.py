"""A Ray cluster of two nodes that differ the way separate machines do, for the tests of this folder.

``ray.cluster_utils.Cluster`` runs every node on this machine, so they share the disk, the venv and the IP.
What can differ does: each node's Ray is started from its own working directory and with its own scratch
directory (``TMPDIR``), and the driver runs from a third directory. A user module is created in a folder
that only the driver's ``sys.path`` names, before rlkit joins the cluster (so it is one of the driver's own
modules); tests rename that folder away to show that the workers import the shipped copy.
"""

import os
import shutil
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

import pytest

USER_MODULE = '''
"""A user's own reward and loss, in a folder only the driver has."""
import torch

from tests.helpers import pg_token_mean_loss


def length_reward(prompts, completions, answer, **columns):
    return [float(c.strip() == a) + 0.1 * len(c) for c, a in zip(completions, answer)]


def doubled_loss(logprobs, batch, counts):
    loss, _ = pg_token_mean_loss(logprobs, batch, counts)
    return 2.0 * loss, {"loss": 2.0 * loss.detach()}


def chatty_loss(logprobs, batch, counts):
    # a letter, not a number: Ray folds lines that differ only in numbers into one ("repeated 3x")
    print(f"loss evaluated by rank letter {'ABCD'[torch.distributed.get_rank()]}", flush=True)
    return pg_token_mean_loss(logprobs, batch, counts)
'''


@dataclass
class TwoNodes:
    cluster: object
    root: Path  # everything of this cluster lives under it
    node_dirs: list  # each node's working directory
    scratch_dirs: list  # each node's TMPDIR
    driver_dir: Path  # the driver's working directory during the tests
    user_dir: Path  # the folder of the driver-only user module
    user_module: object


def start_node(cluster, attempts=5, **args):
    """``cluster.add_node(**args)``, at raised priority and retried: Ray gives a node a fixed 30 s to register,
    which a heavily loaded machine can miss (as in :func:`rlkit.distributed.ensure_ray`)."""
    from rlkit.distributed import raised_priority

    for attempt in range(1, attempts + 1):
        try:
            with raised_priority(enabled=True):
                return cluster.add_node(**args)
        except Exception as e:  # Ray raises a bare Exception when the node misses its deadline
            if "timed out during startup" not in str(e) or attempt == attempts:
                raise


@pytest.fixture(scope="module")
def two_nodes():
    ray = pytest.importorskip("ray")
    from ray.cluster_utils import Cluster

    from rlkit.distributed import ensure_ray

    if ray.is_initialized():
        ray.shutdown()
    root = Path(tempfile.mkdtemp(prefix="rlk-", dir="/tmp"))  # short: Ray's socket paths live under it
    node_dirs = [root / f"node{i}" / "work" for i in range(2)]
    scratch_dirs = [root / f"node{i}" / "scratch" for i in range(2)]
    driver_dir, user_dir = root / "driver", root / "driver-only-code"
    for d in [*node_dirs, *scratch_dirs, driver_dir, user_dir]:
        d.mkdir(parents=True)
        if d in scratch_dirs:
            (d / "ray").mkdir()  # Ray writes the cluster's address under the node's temp dir
    module_name = f"user_rl_{os.getpid()}"
    (user_dir / f"{module_name}.py").write_text(USER_MODULE)
    sys.path.insert(0, str(user_dir))
    user_module = __import__(module_name)

    before_cwd, before_tmp = os.getcwd(), os.environ.get("TMPDIR")
    cluster = Cluster()
    try:
        for i in range(2):
            os.chdir(node_dirs[i])
            os.environ["TMPDIR"] = str(scratch_dirs[i])
            tempfile.tempdir = None  # so Ray's node start reads this TMPDIR
            start_node(cluster, num_cpus=2, temp_dir=str(root / "ray"), **(dict(include_dashboard=False) if i == 0 else {}))
    finally:
        os.chdir(before_cwd)
        if before_tmp is None:
            os.environ.pop("TMPDIR", None)
        else:
            os.environ["TMPDIR"] = before_tmp
        tempfile.tempdir = None
    os.chdir(driver_dir)
    try:
        ensure_ray(cluster.address)
        yield TwoNodes(cluster, root, node_dirs, scratch_dirs, driver_dir, user_dir, user_module)
    finally:
        os.chdir(before_cwd)
        sys.path.remove(str(user_dir))
        ray.shutdown()
        cluster.shutdown()
        shutil.rmtree(root, ignore_errors=True)


class NodeView:
    """A stand-in for a policy rank in the model-folder check, for a test about the check and the copy around
    it. Every node of this simulated cluster sees the driver's disk, so a node without the folder is made by
    showing this actor an empty place instead of ``hide``; the copy is real (Ray's object store, then this
    node's own TMPDIR)."""

    def __init__(self, hide=None):
        self.hide = hide

    def folder_problem(self, path, fingerprint):
        from rlkit.cluster_model import folder_problem

        return folder_problem(path + "-not-on-this-node" if path == self.hide else path, fingerprint)

    def write_cached_folder(self, files, fingerprint):
        from rlkit.cluster_model import write_cached_folder

        return write_cached_folder(files, fingerprint)
