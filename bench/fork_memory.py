"""What a parked fork costs: full weights against low-rank adapters, on the same model.

A parked branch (:mod:`rlkit.run.fork`) holds a copy of the policy's trainable weights and their AdamW moments, so
with adapters (``policy.lora_cfg``) it holds the adapters' alone. For each setting, in a fresh process (one vLLM
engine per process): a session on ``--preset``, one GRPO step, ``b = session.fork()``, ``b.step()`` (which parks
``main``); prints the parked ``main``'s bytes, the trainable and total parameter counts, and the activation's swap
seconds. Last line (bench/run_all.py style): ``fork_full_mib``, ``fork_lora_mib``, ``fork_lora_over_full``.
Usage: python bench/fork_memory.py [--preset quickstart_nano] [--rank 8]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile


def measure(preset: str, lora_rank: int, folder: str) -> dict:
    import rlkit

    overrides = {"logger.log_dir": folder, "sft.enabled": False}
    if lora_rank:
        overrides.update({"policy.lora_cfg.enabled": True, "policy.lora_cfg.dim": lora_rank,
                          "policy.lora_cfg.alpha": 2 * lora_rank})
    session = rlkit.Session.from_config(preset, overrides)
    try:
        session.step()
        branch = session.fork()
        branch.step()  # activates the branch: main is parked
        main = session.branches["main"]
        params = list(session.policy.model.parameters())
        return {"parked_bytes": main.nbytes, "trainable": sum(p.numel() for p in params if p.requires_grad),
                "total": sum(p.numel() for p in params), "swap_seconds": list(getattr(branch, "swap_seconds", []))}
    finally:
        session.close()


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--preset", default="quickstart_nano")
    parser.add_argument("--rank", type=int, default=8)
    parser.add_argument("--one", type=int, default=None, help=argparse.SUPPRESS)  # child: one setting, JSON out
    args = parser.parse_args()
    if args.one is not None:
        with tempfile.TemporaryDirectory() as folder:
            print("RESULT " + json.dumps(measure(args.preset, args.one, folder)))
        return
    results = {}
    for name, rank in (("full", 0), ("lora", args.rank)):
        out = subprocess.run([sys.executable, __file__, "--preset", args.preset, "--one", str(rank)],
                             capture_output=True, text=True, env=dict(os.environ, HF_HUB_OFFLINE="1"))
        lines = [line for line in out.stdout.splitlines() if line.startswith("RESULT ")]
        if not lines:
            raise SystemExit(f"{name}: no result\n{out.stdout[-2000:]}\n{out.stderr[-4000:]}")
        results[name] = json.loads(lines[-1][len("RESULT "):])
        r = results[name]
        print(f"{name:4s}: parked branch {r['parked_bytes'] / 2**20:.3f} MiB; trainable {r['trainable']:,} of "
              f"{r['total']:,} parameters")
    full, lora = results["full"]["parked_bytes"], results["lora"]["parked_bytes"]
    print(f"fork_full_mib={full / 2**20:.3f} fork_lora_mib={lora / 2**20:.3f} fork_lora_over_full={lora / full:.3f}")


if __name__ == "__main__":
    main()
