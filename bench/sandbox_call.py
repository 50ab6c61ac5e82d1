"""Per-call cost of the Python tool's sandbox: the wall time of ``run_python('print(1)')``.

What a multi-turn rollout pays per ``<python>`` call on top of the program itself: the isolation set-up
(namespaces, mounts), the interpreter's start-up and the teardown. Prints the backend, the load average
before and after (the figure moves with the machine's load: compare runs at a similar load), and the
median, 10th and 90th percentile over ``--calls`` calls after ``--warmup``. Last line (bench/run_all.py):
``sandbox_call_median_ms``, ``sandbox_call_p10_ms``, ``sandbox_call_p90_ms``, ``load_before``, ``load_after``.
Before issue 31 (a plain ``unshare -rn`` process writing to a file) the median was 21.5-24 ms at load 4-5 on
2 cores; see docs/measurements.md for the figures after.
Usage: python bench/sandbox_call.py [--calls 40] [--warmup 3] [--sandbox auto|bwrap|unshare|unsafe-process]
"""

from __future__ import annotations

import argparse
import os
import statistics
import time


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--calls", type=int, default=40)
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument("--sandbox", default="auto", choices=("auto", "bwrap", "unshare", "unsafe-process"))
    args = parser.parse_args()
    from rlkit import sandbox

    backend = sandbox.describe_backend(args.sandbox)
    for _ in range(args.warmup):
        sandbox.run_python("print(1)", sandbox=args.sandbox)
    load_before = os.getloadavg()[0]
    walls = []
    for _ in range(args.calls):
        t0 = time.perf_counter()
        result = sandbox.run_python("print(1)", sandbox=args.sandbox)
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
    print(" ".join(f"sandbox_call_{k[:-2]}_ms={figures[k] * 1e3:.1f}" for k in ("median_s", "p10_s", "p90_s"))
          + f" load_before={load_before:.2f} load_after={load_after:.2f}")


if __name__ == "__main__":
    main()
