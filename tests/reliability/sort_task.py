"""Sort three digits, as a newcomer wrote it in JupyterLab (issue 48): ``sort: 7 2 9`` -> ``2 7 9``, their own JSONL
and their own reward module in their working folder, trained from ``quickstart_nano`` with a warm start sized for
RL headroom (``s.sft(20)`` until held-out accuracy passes a share, then GRPO). Used by
tests/reliability/test_sort_task.py; ``python -m tests.reliability.sort_task [SEEDS]`` prints the figures docs cite."""

from __future__ import annotations

import json
import random
import sys
import tempfile
from pathlib import Path

REWARD_MODULE = '''def sorted_reward(prompts, completions, answer, **columns):
    """1.0 when the completion is the three digits in ascending order, spaced as in the answer."""
    return [1.0 if c.strip() == a else 0.0 for c, a in zip(completions, answer)]
'''


def write_task(folder: Path, rows: int = 1000, seed: int = 0) -> Path:
    """``sort.jsonl`` (every distinct triple at most once) and ``sort_rewards.py`` in ``folder``; the JSONL's path."""
    rng = random.Random(seed)
    triples = {tuple(rng.randint(0, 9) for _ in range(3)) for _ in range(rows * 3)}
    lines = [{"prompt": f"sort: {' '.join(map(str, t))}", "answer": " ".join(map(str, sorted(t)))}
             for t in sorted(triples)[:rows]]
    rng.shuffle(lines)
    (folder / "sort.jsonl").write_text("".join(json.dumps(r) + "\n" for r in lines))
    (folder / "sort_rewards.py").write_text(REWARD_MODULE)
    return folder / "sort.jsonl"


def overrides(folder: Path, seed: int) -> dict:
    """Only what the task changes in quickstart_nano (the one fast recipe)."""
    return {"seed": seed, "policy.model_name": str(folder / "model"), "data.task": None,
            "data.path": str(folder / "sort.jsonl"), "env.reward_fn": "sort_rewards:sorted_reward",
            "policy.generation.max_new_tokens": 7, "eval.num_prompts": 100, "logger.log_dir": str(folder / "runs")}


def learn(folder: Path, seed: int, headroom: float = 0.3, sft_chunk: int = 10, max_sft: int = 400,
          rl_steps: int = 60) -> dict:
    """Warm start in chunks until held-out accuracy reaches ``headroom`` (or ``max_sft`` steps), then GRPO with
    dynamic sampling (a long run: quickstart_nano's own advice): accuracy before RL, after, and the SFT steps."""
    import rlkit

    sys.path.insert(0, str(folder))  # the user's working folder, where their reward module is
    try:
        s = rlkit.Session.from_config("quickstart_nano", overrides(folder, seed))
        try:
            accuracy, sft_steps = s.evaluate().accuracy, 0
            while accuracy < headroom and sft_steps < max_sft:  # each sft() continues the last
                sft_steps += len(s.sft(sft_chunk, progress=False).losses)
                accuracy = s.evaluate().accuracy
            s.configure(["grpo.use_dynamic_sampling=true"])
            s.run(rl_steps, progress=False)
            return {"seed": seed, "sft_steps": sft_steps, "before_rl": accuracy, "after_rl": s.evaluate().accuracy,
                    "held_out": s.last_eval.num_prompts}
        finally:
            s.close()
    finally:
        sys.path.remove(str(folder))
        sys.modules.pop("sort_rewards", None)


if __name__ == "__main__":
    results = []
    for seed in [int(x) for x in (sys.argv[1] if len(sys.argv) > 1 else "0,1,2").split(",")]:
        with tempfile.TemporaryDirectory() as name:
            folder = Path(name)
            write_task(folder)
            results.append(learn(folder, seed))
            print(json.dumps(results[-1]), flush=True)
    gains = [r["after_rl"] - r["before_rl"] for r in results]
    print(f"mean held-out gain over {len(gains)} seeds: {sum(gains) / len(gains):+.3f}")
