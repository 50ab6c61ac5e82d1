"""rlkit's Ray worker group on a cluster of two nodes that differ (see conftest.py), as it runs on one machine.

One group of 4 ranks (TP=2 x DP=2, 2 CPUs per node) serves the module: its ranks must be packed one
tensor-parallel group per node, it loads a model given by a path relative to the driver's directory (the
nodes started elsewhere), and its logprobs and weights after a step equal the one-process policy's within
1e-5 (the reference of tests/policy/test_parallel.py). While it holds every CPU, another group cannot be
placed and must say so in time. A refit to a vLLM engine actor moves the weights from rank 0 to the engine;
the bytes of tensors the driver receives from Ray are counted (0), against the same count for the driver's
relay (the whole model). The user's module lives in a folder only the driver had, renamed away before use.
The death test breaks the group, so it runs last.
"""

import os
import re
import shutil
import time

import pytest
import torch

from rlkit.config.backends import MegatronConfig
from rlkit.config.components import OptimizerConfig, PolicyConfig, RayClusterConfig
from tests.helpers import pg_token_mean_loss, random_batch
from tests.policy.test_parallel import check_against_reference, single_process_reference

pytestmark = pytest.mark.slow  # a 2-node cluster, 4 Megatron ranks and a vLLM actor: minutes on 2 cores

ray = pytest.importorskip("ray")


@pytest.fixture(scope="module")
def model_cfg(two_nodes):
    from rlkit.models import make_model

    make_model(two_nodes.driver_dir / "models" / "nano", "nano", "qwen2", seed=1, num_key_value_heads=2)
    # relative: it exists under the driver's directory only, not under either node's
    return PolicyConfig(model_name="models/nano", train_micro_batch_size=4, optimizer=OptimizerConfig(lr=1e-3))


@pytest.fixture(scope="module")
def reference(model_cfg):
    return single_process_reference(model_cfg)


@pytest.fixture(scope="module")
def group(two_nodes, model_cfg):
    from rlkit.policy.workers import RayPolicyGroup

    cfg = model_cfg.model_copy(update={"megatron_cfg": MegatronConfig(tensor_model_parallel_size=2)})
    g = RayPolicyGroup(cfg, world_size=4, seed=0)
    yield g
    g.close()


def test_relative_model_path_is_the_drivers(two_nodes, model_cfg):
    assert not any((d / model_cfg.model_name).exists() for d in two_nodes.node_dirs)
    assert (two_nodes.driver_dir / model_cfg.model_name / "config.json").is_file()


def test_model_folder_is_copied_once_to_a_node_that_lacks_it(two_nodes, model_cfg):
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

    from rlkit.cluster_model import folder_fingerprint, model_folder_on_ranks
    from rlkit.errors import ModelError
    from tests.cluster.conftest import NodeView

    folder = (two_nodes.driver_dir / model_cfg.model_name).resolve()
    alive = [n for n in ray.nodes() if n["Alive"]]
    head = next(n["NodeID"] for n in alive if "node:__internal_head__" in n["Resources"])
    other = next(n["NodeID"] for n in alive if n["NodeID"] != head)
    views = [ray.remote(NodeView).options(num_cpus=0, scheduling_strategy=NodeAffinitySchedulingStrategy(node, soft=False))
             .remote(hide) for node, hide in [(head, None), (head, None), (other, str(folder)), (other, str(folder))]]
    names = ["node A", "node A", "node B", "node B"]

    def gather(refs, what):
        return ray.get(refs)

    paths = model_folder_on_ranks(folder, views, names, ship_max_mb=1024, gather=gather)
    copy = two_nodes.scratch_dirs[1] / "rlkit-models" / folder_fingerprint(folder)
    assert paths == [str(folder), str(folder), str(copy), str(copy)]
    assert {p.name: p.read_bytes() for p in copy.iterdir()} == {p.name: p.read_bytes() for p in folder.iterdir()}
    assert not (two_nodes.scratch_dirs[0] / "rlkit-models").exists()  # node A saw the folder: nothing copied
    assert model_folder_on_ranks(folder, views, names, ship_max_mb=1024, gather=gather) == paths  # cache reused

    with pytest.raises(ModelError) as info:
        model_folder_on_ranks(folder, views, names, ship_max_mb=0, gather=gather)
    message = str(info.value)
    for rank in (2, 3):
        assert f"rank {rank} on node B sees no model folder (no config.json) at {folder}" in message
    assert "rank 0" not in message and "policy.ray_cfg.ship_model_max_mb=0" in message
    for view in views:
        ray.kill(view)


def test_tensor_parallel_groups_are_packed_per_node_and_match_one_process(group, reference):
    nodes = [r.node_id for r in group.ranks]
    assert [p.node_id for p in group.placements] == nodes  # the ranks run where they were placed
    assert nodes[0] == nodes[1] and nodes[2] == nodes[3] and nodes[0] != nodes[2], nodes  # one TP pair per node
    assert len({n["NodeID"] for n in ray.nodes() if n["Alive"]}) == 2
    assert [(r.dp_rank, r.leader) for r in group.ranks] == [(0, True), (0, False), (1, True), (1, False)]
    assert all(r.omp_num_threads == "1" and r.torch_threads == 1 for r in group.ranks)  # 2 CPUs, 2 ranks a node
    check_against_reference(group, reference)


def test_a_group_that_cannot_be_placed_fails_in_time_naming_what_is_missing(group, model_cfg):
    from rlkit.cluster_placement import PlacementError
    from rlkit.policy.workers import RayPolicyGroup

    cfg = model_cfg.model_copy(update={"ray_cfg": RayClusterConfig(placement_timeout_s=3)})
    t0 = time.perf_counter()
    with pytest.raises(PlacementError) as info:
        RayPolicyGroup(cfg, world_size=2)  # the module's group holds all 4 CPUs
    waited = time.perf_counter() - t0
    message = str(info.value)
    assert 3 <= waited < 30, waited
    assert "within 3 s" in message and "CPU=2 in all" in message and "missing: CPU=2" in message, message
    assert "policy.ray_cfg.placement_timeout_s" in message and message.count("(id ") == 2  # both nodes listed
    assert ray.available_resources().get("CPU", 0) == 0  # the pending group was removed, the module's kept


def test_user_module_that_only_the_driver_had_reaches_the_workers(group, two_nodes, model_cfg):
    """The user's loss is pickled by reference (module and name), so each rank imports the user's module: from
    the copy rlkit shipped, since its folder is gone by then (renamed here). A module imported after rlkit
    joined Ray was not shipped, and its import fails on the workers: the check can fail."""
    from rlkit.policy.workers import WorkerError

    batch = random_batch(b=8, t=16)
    user = two_nodes.user_module
    expected = group.evaluate_loss(batch, pg_token_mean_loss)["loss"]
    moved = two_nodes.user_dir.with_name("moved-away")
    shutil.move(two_nodes.user_dir, moved)
    try:
        assert abs(group.evaluate_loss(batch, user.doubled_loss)["loss"] - 2 * expected) < 1e-5
        late = moved / "late_user_module.py"
        late.write_text("from tests.helpers import pg_token_mean_loss\n\n\n"
                        "def late_loss(logprobs, batch, counts):\n"
                        "    return pg_token_mean_loss(logprobs, batch, counts)\n")
        import sys

        sys.path.insert(0, str(moved))
        try:
            import late_user_module
        finally:
            sys.path.remove(str(moved))
        with pytest.raises(WorkerError, match="No module named 'late_user_module'"):
            group.evaluate_loss(batch, late_user_module.late_loss)
    finally:
        shutil.move(moved, two_nodes.user_dir)


def test_worker_output_reaches_the_driver_with_its_rank(group, two_nodes, capfd):
    group.evaluate_loss(random_batch(b=8, t=16), two_nodes.user_module.chatty_loss)
    seen = ""
    for _ in range(40):  # Ray's log monitor forwards the lines within about a second
        time.sleep(0.5)
        seen += capfd.readouterr().out
        if seen.count("loss evaluated by rank letter") >= 4:
            break
    seen = re.sub(r"\x1b\[[0-9;]*m", "", seen)  # Ray colours the prefix
    for rank in range(4):
        assert re.search(rf"\(rank {rank} pid=\d+[^)]*\) loss evaluated by rank letter {'ABCD'[rank]}\b", seen), seen


def test_refit_sends_the_weights_from_rank_0_not_through_the_driver(group, model_cfg, monkeypatch):
    from rlkit.config.components import GenerationConfig, VllmConfig
    from rlkit.generation.remote import RemoteGenerator
    from rlkit.weight_sync import BroadcastReceiver, BroadcastWeightSync, RanksBroadcastWeightSync
    from tests.generation.test_vllm_refit import mismatch

    received = []  # bytes of the tensors in everything the driver takes out of Ray's object store
    real_get = ray.get

    def counting_get(refs, *args, **kwargs):
        out = real_get(refs, *args, **kwargs)
        received.append(tensor_bytes(out))
        return out

    cfg = GenerationConfig(vllm_cfg=VllmConfig(kv_cache_space_gib=0.0625))
    generator = RemoteGenerator(model_cfg.model_name, cfg, max_model_len=128, actor_extension=BroadcastReceiver)
    try:
        sync = RanksBroadcastWeightSync(generator, bucket_bytes=1e5)  # several buckets
        group.train_step(random_batch(b=8, t=16, seed=5), pg_token_mean_loss)
        stale, _, _ = mismatch(group, generator)  # the engine holds the folder's weights, the group moved on
        assert stale > 1e-2
        model_bytes = sum(t.numel() * t.element_size() for t in group.hf_state_dict().values())

        monkeypatch.setattr(ray, "get", counting_get)
        report = sync.sync(group, generator)
        through_driver = sum(received)
        monkeypatch.setattr(ray, "get", real_get)

        assert through_driver == 0  # no tensor came back
        assert report.bytes_moved == model_bytes and report.num_buckets > 2
        assert report.policy_version == group.version > 0
        worst, mean, _ = mismatch(group, generator)
        assert worst < 1e-3 and mean < 1e-4, (worst, mean)

        # the same count for the driver's relay (the group seen as a plain weight source): the whole model
        received.clear()
        monkeypatch.setattr(ray, "get", counting_get)
        relayed = BroadcastWeightSync(generator, bucket_bytes=1e5).sync(PlainWeightSource(group), generator)
        monkeypatch.setattr(ray, "get", real_get)
        assert sum(received) >= model_bytes == relayed.bytes_moved
        assert mismatch(group, generator)[0] < 1e-3
    finally:
        generator.close()


class PlainWeightSource:
    """The group behind only the WeightSource protocol (no broadcast_weights): the sync relays through here."""

    def __init__(self, policy):
        self.policy = policy
        self.version = policy.version

    def export_hf_groups(self):
        return self.policy.export_hf_groups()


def tensor_bytes(value) -> int:
    if isinstance(value, torch.Tensor):
        return value.numel() * value.element_size()
    if isinstance(value, (list, tuple)):
        return sum(tensor_bytes(v) for v in value)
    if isinstance(value, dict):
        return sum(tensor_bytes(v) for v in value.values())
    return 0


def rank3_dies(logprobs, batch, counts):
    if torch.distributed.get_rank() == 3:
        os._exit(1)
    return pg_token_mean_loss(logprobs, batch, counts)


def test_a_dead_worker_is_named_with_its_node(group):
    """Last: it breaks the module's group."""
    from rlkit.policy.workers import WorkerError

    node = group.placements[3].node
    with pytest.raises(WorkerError) as info:
        group.evaluate_loss(random_batch(b=8, t=16), rank3_dies)
    assert f"rank 3 of 4 died in evaluate_loss() on {node}" in str(info.value)
    assert re.fullmatch(r"node \d+\.\d+\.\d+\.\d+ \(id [0-9a-f]{8}\)", node)
    group.close()  # frees its CPUs for the session test


def test_session_step_on_the_cluster_with_the_users_reward_module(two_nodes):
    """A whole GRPO step as a notebook runs it: the preset model made at a relative path (the driver's), the
    reward from the user's driver-only module (its folder moved away meanwhile), training on 2 ranks placed
    on the cluster, and a refit of the colocated engine."""
    import rlkit
    from rlkit.envs import RewardFunctionEnvironment
    from rlkit.policy.workers import RayPolicyGroup
    from tests.session.conftest import tiny_overrides

    overrides = tiny_overrides(two_nodes.root / "session", **{"policy.num_workers": 2,
                                                              "policy.model_name": "models/session-nano"})
    session = rlkit.Session.from_config("quickstart", overrides,
                                        env=RewardFunctionEnvironment(two_nodes.user_module.length_reward))
    moved = two_nodes.user_dir.with_name("moved-away")
    shutil.move(two_nodes.user_dir, moved)
    try:
        assert isinstance(session.policy, RayPolicyGroup) and session.policy.dp_size == 2
        assert (two_nodes.driver_dir / "models" / "session-nano" / "config.json").is_file()
        metrics = session.step()
        assert session.policy.version == 1 and not session.stale
        assert abs(session.batch.info["token_mult_prob_error"] - 1.0) < 1e-3  # the ranks' logprobs, in row order
        # the user's reward: 0.1 per character, plus 1 for an exact answer
        residual = [r - 0.1 * len(c) for r, c in zip(session.batch.rewards.tolist(), session.batch.completions)]
        assert all(min(abs(x), abs(x - 1)) < 1e-4 for x in residual), residual
        assert metrics["train/grad_norm"] > 0
    finally:
        session.close()
        shutil.move(moved, two_nodes.user_dir)
