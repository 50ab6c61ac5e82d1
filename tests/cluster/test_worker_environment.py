"""The pieces of a cluster run that need no cluster: the workers' environment and code, the rank packing rule,
the model folder's fingerprint and node-local copy, and the race-free rendezvous (two threads, real gloo)."""

import sys
import threading

import pytest
import torch

from rlkit.cluster import job_runtime_env, package_versions, version_mismatches, worker_env_vars
from rlkit.cluster_model import folder_fingerprint, folder_files, folder_problem, write_cached_folder
from rlkit.cluster_placement import pack_size
from rlkit.config.backends import DTensorConfig, MegatronConfig
from rlkit.config.components import PolicyConfig
from rlkit.errors import ConfigError


def test_worker_variables_carry_threads_offline_settings_and_the_collectives_interfaces(monkeypatch):
    monkeypatch.setenv("NCCL_SOCKET_IFNAME", "eth7")
    monkeypatch.setenv("GLOO_SOCKET_IFNAME", "eth8")
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("MY_SECRET_TOKEN", "x")
    env = worker_env_vars(3)
    assert env["OMP_NUM_THREADS"] == "3" and env["NCCL_SOCKET_IFNAME"] == "eth7" and env["GLOO_SOCKET_IFNAME"] == "eth8"
    assert env["HF_HUB_OFFLINE"] == "1" and "MY_SECRET_TOKEN" not in env and "PYTHONPATH" not in env


def test_job_environment_ships_rlkit_and_the_drivers_own_modules_only(tmp_path, monkeypatch):
    (tmp_path / "my_reward_mod.py").write_text("def reward(*a, **k):\n    return []\n")
    package = tmp_path / "my_pkg"
    package.mkdir()
    (package / "__init__.py").write_text("")
    monkeypatch.syspath_prepend(str(tmp_path))
    __import__("my_reward_mod")
    extra = tmp_path / "not_imported.py"
    extra.write_text("")
    env = job_runtime_env([str(extra), "my_pkg"])
    modules = env["py_modules"]
    assert modules[0].endswith("/rlkit") and str(tmp_path / "my_reward_mod.py") in modules
    assert str(extra) in modules and str(package) in modules
    assert not any("site-packages" in m or m.endswith(("/torch", "/ray")) for m in modules), modules
    assert "OMP_NUM_THREADS" not in env["env_vars"]  # each actor sets its own
    sys.modules.pop("my_reward_mod")
    sys.modules.pop("my_pkg")
    with pytest.raises(ConfigError, match="policy.ray_cfg.py_modules: 'no_such_module_xyz'"):
        job_runtime_env(["no_such_module_xyz"])


def test_version_mismatches_name_package_rank_and_node():
    driver = package_versions()
    assert {"python", "torch", "ray"} <= set(driver)
    assert version_mismatches(driver, dict(driver), "rank 1 (node a)") == []
    lines = version_mismatches(driver, dict(driver, torch="0.1"), "rank 1 (node a)")
    assert lines == [f"torch 0.1 on rank 1 (node a), {driver['torch']} on the driver"]


@pytest.mark.parametrize("megatron, world, expected", [
    (dict(tensor_model_parallel_size=2), 4, 2),
    (dict(), 4, 1),
    (dict(pipeline_model_parallel_size=2), 4, 1),
    (dict(tensor_model_parallel_size=2, expert_model_parallel_size=2), 4, 4),
    (dict(expert_model_parallel_size=2), 6, 2),
    (dict(expert_model_parallel_size=4), 6, 1),  # the expert group does not tile the world: TP only
])
def test_pack_size_is_the_tensor_parallel_group_widened_to_the_expert_group(megatron, world, expected):
    cfg = PolicyConfig(model_name="m", megatron_cfg=MegatronConfig(**megatron))
    assert pack_size(cfg, world) == expected


def test_dtensor_ranks_are_packed_one_by_one():
    cfg = PolicyConfig(model_name="m", dtensor_cfg=DTensorConfig(enabled=True), megatron_cfg=MegatronConfig(enabled=False))
    assert pack_size(cfg, 4) == 1


def test_model_folder_fingerprint_copy_and_problems(tmp_path, monkeypatch, model_factory):
    folder = model_factory("nano", "llama")
    fingerprint = folder_fingerprint(folder)
    assert folder_problem(str(folder), fingerprint) is None
    assert folder_problem(str(tmp_path / "absent"), fingerprint) == "no model folder (no config.json)"

    monkeypatch.setenv("TMPDIR", str(tmp_path / "scratch"))
    (tmp_path / "scratch").mkdir()
    import tempfile

    monkeypatch.setattr(tempfile, "tempdir", None)  # re-read TMPDIR
    copy = write_cached_folder(folder_files(folder), fingerprint)
    assert copy == str(tmp_path / "scratch" / "rlkit-models" / fingerprint)
    assert folder_fingerprint(copy) == fingerprint
    assert write_cached_folder({}, fingerprint) == copy  # already there: reused, nothing written

    changed = tmp_path / "changed"
    changed.mkdir()
    for name, data in folder_files(folder).items():
        (changed / name).parent.mkdir(parents=True, exist_ok=True)
        (changed / name).write_bytes(data.replace(b'"num_hidden_layers": 2', b'"num_hidden_layers": 3')
                                     if name == "config.json" else data)
    assert folder_problem(str(changed), fingerprint) == "a different folder (other files or sizes)"


def test_rendezvous_on_a_port_the_os_picks_and_a_pair_group_over_it():
    from rlkit.distributed import broadcast, host_store, pair_group, pair_group_on

    store, (host, port) = host_store(2, timeout_s=60)
    assert port > 0
    received = torch.zeros(4)
    errors = []

    def rank1():
        try:
            _, group = pair_group(host, port, rank=1, timeout_s=60)
            broadcast(group, received, root=0)
        except Exception as e:  # pragma: no cover - reported below
            errors.append(e)

    peer = threading.Thread(target=rank1)
    peer.start()
    group = pair_group_on(store, 0, timeout_s=60)
    broadcast(group, torch.arange(4.0), root=0)
    peer.join(60)
    assert not errors and received.tolist() == [0.0, 1.0, 2.0, 3.0]
    with pytest.raises(ValueError, match="rank 0 hosts the store"):
        pair_group(host, port, rank=0)
