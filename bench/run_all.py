"""Run every CPU benchmark in bench/, then print all their figures in one table and write them as JSON.

Each benchmark prints its own side-by-side measurement and, as its last line, its headline figures as
``name=value`` pairs (``refit_over_floor=1.04 ...``). This script shows each benchmark's output as it runs,
collects those lines, prints one table (with the issue's targets where there is one) and writes
``runs/bench/<commit>.json``: the commit, the time, the machine and its load, and every figure, so runs on
different commits can be compared (``--compare runs/bench/<other>.json`` adds their column to the table).
A benchmark that fails is reported in the table and the JSON; the others still run.

bench/gpu_check.py is for a GPU machine and is not run here.
Usage: python bench/run_all.py [--only startup,refit_vs_floor] [--compare runs/bench/abc1234.json] [--out PATH]
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import subprocess
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
SCRIPTS = ["startup", "refit_vs_floor", "step_overhead", "broadcast_refit", "async_vs_sync", "same_work",
           "rollout_vs_vllm", "dynamic_batching", "megatron_vs_dtensor", "parallel_layouts", "sandbox_call",
           "fork_memory"]
TARGETS = {  # issue 17's acceptance list: figure -> (comparison, bound)
    "refit_over_floor": ("<=", 1.2),
    "broadcast_refit_over_raw": ("<=", 1.5),
    "rollout_over_vllm": (">=", 0.95),
    "async_over_sync": (">=", 1.0),
    "cpu_s_per_step": ("<=", 0.73),
    "peak_rss_mb": ("<=", 1500),
    "session_over_direct": ("<=", 1.05),
}


def figures_of(last_line: str) -> dict[str, float]:
    """``name=value`` pairs of a benchmark's last line (pairs whose value is not a number are skipped)."""
    out = {}
    for pair in last_line.split():
        name, sep, value = pair.partition("=")
        try:
            if sep:
                out[name] = float(value)
        except ValueError:
            pass
    return out


def run(name: str) -> tuple[dict[str, float], str | None]:
    """Run ``bench/<name>.py`` showing its output; its figures, or the reason it gave none."""
    print(f"== {name}.py", flush=True)
    proc = subprocess.Popen([sys.executable, str(HERE / f"{name}.py")], stdout=subprocess.PIPE, text=True)
    lines = []
    for line in proc.stdout:
        print(line, end="", flush=True)
        lines.append(line.strip())
    if proc.wait() != 0:
        return {}, f"exit status {proc.returncode}"
    last = next((line for line in reversed(lines) if line), "")
    figures = figures_of(last)
    return figures, None if figures else "no name=value figures on its last line"


def verdict(name: str, value: float) -> str:
    if name not in TARGETS:
        return ""
    op, bound = TARGETS[name]
    met = value <= bound if op == "<=" else value >= bound
    return f"{op} {bound:g}: {'met' if met else 'MISSED'}"


def commit() -> str:
    try:
        sha = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True, check=True,
                             cwd=HERE).stdout.strip()
        dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], capture_output=True,
                               text=True, cwd=HERE).stdout.strip()
        return sha + ("-dirty" if dirty else "")
    except (OSError, subprocess.CalledProcessError):
        return "unknown"


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--only", default=None, help="comma-separated benchmark names (default: all)")
    parser.add_argument("--compare", default=None, help="a JSON file an earlier run wrote")
    parser.add_argument("--out", default=None, help="where to write the JSON (default runs/bench/<commit>.json)")
    args = parser.parse_args()
    names = args.only.split(",") if args.only else SCRIPTS
    unknown = sorted(set(names) - set(SCRIPTS))
    if unknown:
        parser.error(f"unknown benchmark(s) {unknown}; known: {', '.join(SCRIPTS)}")
    before = json.loads(Path(args.compare).read_text())["results"] if args.compare else {}

    load_before = os.getloadavg()[0]
    started = datetime.datetime.now(datetime.timezone.utc)
    results, failures = {}, {}
    for name in names:
        figures, failure = run(name)
        results[name] = figures
        if failure:
            failures[name] = failure
    record = {
        "commit": commit(), "started": started.isoformat(timespec="seconds"),
        "minutes": round((datetime.datetime.now(datetime.timezone.utc) - started).total_seconds() / 60, 1),
        "machine": {"cpus": os.cpu_count(), "load_average_start": round(load_before, 1),
                    "load_average_end": round(os.getloadavg()[0], 1), "python": sys.version.split()[0]},
        "results": results, "failures": failures,
    }
    out = Path(args.out or HERE.parent / "runs" / "bench" / f"{record['commit']}.json")
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(record, indent=1) + "\n")

    print(f"\n== all figures: commit {record['commit']}, {record['machine']['cpus']} CPUs, load average "
          f"{record['machine']['load_average_start']} -> {record['machine']['load_average_end']}")
    header = f"{'benchmark':<20}{'figure':<36}{'value':>10}"
    print(header + (f"{'before':>10}" if before else "") + "  target")
    for name in names:
        if name in failures:
            print(f"{name:<20}{'FAILED: ' + failures[name]}")
        for figure, value in results[name].items():
            old = before.get(name, {}).get(figure)
            old_cell = (f"{old:>10.3g}" if old is not None else f"{'-':>10}") if before else ""
            print(f"{name:<20}{figure:<36}{value:>10.4g}{old_cell}  {verdict(figure, value)}")
    print(f"written to {out}")


if __name__ == "__main__":
    main()
