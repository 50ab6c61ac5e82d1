"""bench/vs_trl_real.py's paired reading of a learning comparison: rlkit's held-out accuracy minus TRL's seed by seed,
its mean and standard error over the seeds, and one accuracy's binomial standard error. No model, no TRL."""

import os
import sys

import pytest

from tests.bench import BENCH, bench_script


@pytest.fixture(scope="module")
def vs_trl_real():
    saved_env, saved_path = dict(os.environ), list(sys.path)
    sys.path.insert(0, str(BENCH))  # the script imports its siblings (arith_chat, vs_trl) as a run from bench/ does
    try:
        return bench_script("vs_trl_real")
    finally:  # importing it sets the thread count and offline mode for its own sides: not for this test process
        os.environ.clear()
        os.environ.update(saved_env)
        sys.path[:] = saved_path


def pairs(after: list[tuple[float, float]], n: int = 200) -> list[dict]:
    return [{"seed": i, "rlkit": {"after": {"accuracy": a, "n": n}}, "trl": {"after": {"accuracy": t, "n": n}}}
            for i, (a, t) in enumerate(after)]


def test_the_difference_its_standard_error_and_the_evaluations_noise(vs_trl_real, capsys):
    out = vs_trl_real.paired_difference(pairs([(0.315, 0.31), (0.24, 0.28), (0.25, 0.335)]))
    assert out["by_seed"] == pytest.approx([0.005, -0.04, -0.085])
    assert out["mean"] == pytest.approx(-0.04)
    assert out["standard_error"] == pytest.approx((0.00405 / 2 / 3) ** 0.5)  # squared deviations 0.045², 0, 0.045²
    acc = (0.315 + 0.31 + 0.24 + 0.28 + 0.25 + 0.335) / 6
    assert out["eval_binomial_se"] == pytest.approx((acc * (1 - acc) / 200) ** 0.5)
    assert "mean -0.040, standard error over seeds 0.026" in capsys.readouterr().out


def test_one_seed_has_no_standard_error_over_seeds(vs_trl_real, capsys):
    out = vs_trl_real.paired_difference(pairs([(0.3, 0.2)]))
    assert out["mean"] == pytest.approx(0.1) and out["standard_error"] is None
    assert "over seeds" not in capsys.readouterr().out
