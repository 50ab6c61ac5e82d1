"""Shared fixtures: offline settings and tiny model folders made in temporary directories."""

import os

# Must be set before torch loads OpenMP: idle OpenMP threads sleep instead of spinning, which keeps several
# test processes (Ray workers, tutorial kernels, a JupyterLab server) from starving each other on 2 cores.
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
# Tests use nano/tiny models, where a second thread buys nothing and several processes (Ray workers,
# tutorial kernels, subprocess runs) on 2 cores would oversubscribe them.
os.environ.setdefault("OMP_NUM_THREADS", "1")
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
os.environ.setdefault("WANDB_MODE", "offline")

import signal  # noqa: E402

import pytest  # noqa: E402

# A Jupyter kernel turns SIGINT (the stop button) into KeyboardInterrupt, and the interrupt tests rely on it.
# A CI runner that starts us in the background (``nohup ... &``, job control off) hands Python SIGINT as
# ignored, and then Python installs no KeyboardInterrupt handler: restore the kernel's behaviour.
signal.signal(signal.SIGINT, signal.default_int_handler)

from rlkit.models import make_model  # noqa: E402


@pytest.fixture(scope="session")
def model_factory(tmp_path_factory):
    """make(preset, family, **overrides) -> path; each distinct request is made once per test session."""
    made = {}

    def make(preset="nano", family="llama", seed=0, **overrides):
        key = (preset, family, seed, tuple(sorted(overrides.items())))
        if key not in made:
            folder = tmp_path_factory.mktemp(f"{preset}-{family}")
            made[key] = make_model(folder, preset, family, seed=seed, **overrides)
        return made[key]

    return make


@pytest.fixture(scope="session")
def smollm2_folder():
    """SmolLM2-135M-Instruct as an HF folder, converted from its pinned wheel into rlkit's cache on first use
    (about 25 s; later sessions and CI runs on the same machine find it there)."""
    from rlkit.models.pretrained import get_model

    return get_model("smollm2-135m-instruct")
