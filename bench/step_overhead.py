"""Session.step() wall time divided by the same stages called directly on the components, in one run.

Both sides run rollout, score, advantages, logprobs, train and refit on the same policy, generator and
environment; they alternate step by step so drift in machine load hits both equally. Target: <= 1.05.
Usage: python bench/step_overhead.py [--steps 20]
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=20)
    args = parser.parse_args()

    import rlkit
    from rlkit import stages

    with tempfile.TemporaryDirectory() as tmp:
        s = rlkit.Session.from_config("quickstart", {
            "policy.model_name": f"{tmp}/model", "sft.enabled": False, "data.num_train": 2000,
            "grpo.use_dynamic_sampling": False,  # one rollout per step on both sides
            "data.num_validation": 16})
        g = s.config.grpo

        def direct() -> None:
            rows = s.sampler.next_batch()
            b = stages.rollout(s.generator, s.tokenizer, rows, s.sampling(), s.policy.version, s.settings.rollout)
            b = stages.score(b, s.env)
            b = stages.advantages(b, g.advantage_estimator, g.advantage_params(), s.baseline)
            b = stages.logprobs(b, s.policy, s.loss_fn.needs_reference)
            stages.train(b, s.policy, s.loss_fn)
            # keep the session's bookkeeping in step, or its next step() would start with an extra refit
            s.generator_version = stages.refit(s.policy, s.generator).policy_version

        for _ in range(3):  # warm-up both paths
            s.step()
            direct()
        session_t, direct_t = [], []
        for _ in range(args.steps):
            t0 = time.perf_counter()
            s.step()
            session_t.append(time.perf_counter() - t0)
            t0 = time.perf_counter()
            direct()
            direct_t.append(time.perf_counter() - t0)
        s.close()

    a, b = statistics.median(session_t), statistics.median(direct_t)
    print(f"Session.step():          median {a * 1e3:7.1f} ms over {args.steps} steps")
    print(f"stages called directly:  median {b * 1e3:7.1f} ms over {args.steps} steps")
    print(f"ratio session / direct: {a / b:.3f} (target <= 1.05)")
    print(f"session_over_direct={a / b:.3f}")


if __name__ == "__main__":
    main()
