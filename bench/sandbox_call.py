"""Per-call cost of the Python tool's sandbox: the wall time of ``run_python('print(1)')``.

What a multi-turn rollout pays per ``<python>`` call on top of the program itself: the isolation set-up
(namespaces, mounts), the interpreter's start-up and the teardown. Prints the backend, the load average
before and after (the figure moves with the machine's load: compare runs at a similar load), and the
median, 10th and 90th percentile over ``--calls`` calls after ``--warmup``. Last line (bench/run_all.py):
``median_s``, ``p10_s``, ``p90_s``, ``backend``, ``load_before``, ``load_after``.
Usage: python bench/sandbox_call.py [--calls 40] [--warmup 3]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import time


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--calls", type=int, default=40)
    parser.add_argument("--warmup", type=int, default=3)
    args = parser.parse_args()
    from rlkit.envs import sandbox

    backend = getattr(sandbox, "describe_backend", lambda: "unshare -rn (issue-31 baseline)")()
    for _ in range(args.warmup):
        sandbox.run_python("print(1)")
    load_before = os.getloadavg()[0]
    walls = []
    for _ in range(args.calls):
        t0 = time.perf_counter()
        result = sandbox.run_python("print(1)")
        walls.append(time.perf_counter() - t0)
        if result.output != "1\n":
            raise SystemExit(f"run_python('print(1)') gave {result!r}")
    load_after = os.getloadavg()[0]
    walls.sort()
    figures = {"median_s": statistics.median(walls), "p10_s": walls[len(walls) // 10],
               "p90_s": walls[(len(walls) * 9) // 10], "backend": backend, "load_before": load_before,
               "load_after": load_after, "calls": args.calls}
    print(f"run_python('print(1)') over {args.calls} calls ({backend}); load average {load_before:.2f} -> "
          f"{load_after:.2f} on {os.cpu_count()} cores")
    print(f"median {figures['median_s'] * 1e3:.1f} ms, p10 {figures['p10_s'] * 1e3:.1f} ms, "
          f"p90 {figures['p90_s'] * 1e3:.1f} ms")
    print(json.dumps(figures))


if __name__ == "__main__":
    main()
