import pytest


@pytest.fixture(scope="module")
def ray_cluster():
    """A local Ray cluster of 2 CPUs for a module's worker groups (joined if one is already up)."""
    ray = pytest.importorskip("ray")
    from rlkit.policy.workers import start_ray

    started = start_ray(num_cpus=2)
    yield
    if started:
        ray.shutdown()
