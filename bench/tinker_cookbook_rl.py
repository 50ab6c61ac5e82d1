"""tinker-cookbook's RL recipe (``tinker_cookbook.recipes.math_rl.train``, ``env=arithmetic``) run unchanged against
rlkit's Tinker service, with its reward per step (issue 51).

Two interpreters. This script runs in rlkit's ``.venv``; the cookbook runs in its own virtual environment,
``bench/.venv-tinker`` (``scripts/setup-tinker-cookbook.sh``, never rlkit's lock).

1. A warm start, full weights, in process (:func:`warm_start`): the nano model (BPE tokenizer: the char tokenizer has
   no ``"\\n"``, so the renderer's stop sequence ``"\\n\\nUser:"`` could never be sampled) takes 60 cross-entropy
   steps on the recipe's own prompts with their answers, rendered by the cookbook's ``role_colon`` renderer (this
   file again under the cookbook's interpreter, :func:`warm_start_data`), through the service's own conversion and
   loss; then it is exported as a folder. Why: a random model gets no reward from the recipe (measured: -0.100 at
   every step, no group with a spread, nothing to learn from), and adapters cannot fix that, since rlkit's LoRA
   leaves the unembedding frozen and a random unembedding caps every logit near 0.
2. A Session over that folder with LoRA (``quickstart_nano``, ``policy.lora_cfg.dim`` = the recipe's rank, a
   sequence length that holds the few-shot prompt), served by :class:`rlkit.tinker_api.TinkerService` in a
   background thread, and the recipe, ``python -m tinker_cookbook.recipes.math_rl.train``, unchanged, with
   configuration values only: model name = the local folder, ``renderer_name=role_colon``, the service's
   ``base_url`` (and ``TINKER_API_KEY``), a small batch, ``loss_fn=importance_sampling`` (the recipe's default
   ``stable_reinforce`` is not served). Its ``metrics.jsonl`` gives ``env/all/reward/total`` per step (the
   cookbook's arithmetic env: 1 for the right sum, minus 0.1 without the stop sequence).

Run: ``make tinker-cookbook-check`` (sets the venv up first), or ``.venv/bin/python bench/tinker_cookbook_rl.py
--steps 6``. Prints the reward per step and first-vs-last; exits 1 when the last steps' mean is not above the first
steps'. Deliberate simplifications: one seed, the nano model, a warm start short enough to leave the stop sequence
mostly unlearned (about 1 sample in 10 ends with it), so the reward has room to rise within a few steps on 2 CPU
cores; the rise is then mostly that format term, not arithmetic.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import warnings
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
COOKBOOK_PYTHON = ROOT / "bench" / ".venv-tinker" / "bin" / "python"


def warm_start_data(model: str, examples: int, seed: int) -> None:
    """The arithmetic env's prompts with their answers, rendered by the cookbook's ``role_colon`` renderer as
    cross-entropy datums (cookbook's interpreter), printed as JSON lines: ``tokens`` (model input), ``targets``,
    ``weights``."""
    import random

    from tinker_cookbook import renderers
    from tinker_cookbook.recipes.math_rl.arithmetic_env import ArithmeticEnv
    from tinker_cookbook.renderers import TrainOnWhat
    from tinker_cookbook.supervised.data import conversation_to_datum
    from tinker_cookbook.tokenizer_utils import get_tokenizer

    renderer = renderers.get_renderer("role_colon", get_tokenizer(model))
    rng = random.Random(seed)
    for _ in range(examples):
        x, y = rng.randint(0, 100), rng.randint(0, 100)
        convo = ArithmeticEnv.standard_fewshot_prefix() + [
            {"role": "user", "content": f"What is {x} + {y}?"}, {"role": "assistant", "content": str(x + y)}]
        d = conversation_to_datum(convo, renderer, None, TrainOnWhat.LAST_ASSISTANT_MESSAGE)
        print(json.dumps({"tokens": d.model_input.to_ints(), "targets": d.loss_fn_inputs["target_tokens"].tolist(),
                          "weights": d.loss_fn_inputs["weights"].tolist()}))


def warm_start(seed: int, steps: int, batch: int, lr: float, folder: Path, env: dict) -> None:
    """Full-weight cross-entropy steps on :func:`warm_start_data`'s rows (the service's own conversion and loss, in
    process, on the nano model with the BPE tokenizer, whose ``"\\n"`` the char tokenizer lacks), the result
    exported as an HF folder. Full weights because the service's adapters leave the unembedding frozen (rlkit's
    LoRA is on the decoder's linear layers), and a random model's frozen unembedding caps every logit near 0, so
    adapters alone cannot make it confident of any token."""
    import numpy as np

    import rlkit
    from rlkit.tinker_api.backend import apply_adam
    from rlkit.tinker_api.convert import Datum, datums_to_batch
    from rlkit.tinker_api.losses import TinkerLoss

    s = rlkit.Session.from_config("quickstart_nano", [
        "policy.model_tokenizer=bpe", "policy.max_grad_norm=null", "policy.max_total_sequence_length=96",
        f"seed={seed}", f"logger.log_dir={folder.parent / 'warm-start'}"])
    s.loss_fn = TinkerLoss()
    dump = subprocess.run([str(COOKBOOK_PYTHON), __file__, "--warm-start-data", str(s.config.policy.model_name),
                           "--warm-steps", str(steps), "--seed", str(seed)], env=env, check=True, capture_output=True,
                          text=True).stdout
    rows = [json.loads(line) for line in dump.splitlines()]
    for step in range(steps):
        chunk = [rows[(step * batch + i) % len(rows)] for i in range(batch)]
        data = [Datum(tuple(r["tokens"]), {"target_tokens": np.array(r["targets"]),
                                           "weights": np.array(r["weights"], dtype=np.float32)}) for r in chunk]
        with warnings.catch_warnings():  # nothing sampled these tokens: no generator logprobs to compare with
            warnings.filterwarnings("ignore", message="generator and trainer logprobs disagree")
            b = s.logprobs(datums_to_batch(data, "cross_entropy", {}, s.tokenizer.pad_token_id, s.policy.version))
        apply_adam(s, {"learning_rate": lr})
        loss = s.train(b, allow_reuse=True).values["train/loss"]
        if (step + 1) % 10 == 0 or step == steps - 1:
            print(f"warm start {step + 1}/{steps}: loss per sequence {float(loss) / batch:.3f}", flush=True)
    s.export_hf(folder)
    s.close()


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--steps", type=int, default=6, help="the recipe's max_steps")
    p.add_argument("--rank", type=int, default=8, help="LoRA rank (policy.lora_cfg.dim and the recipe's lora_rank)")
    p.add_argument("--group-size", type=int, default=8)
    p.add_argument("--groups-per-batch", type=int, default=8)
    p.add_argument("--learning-rate", type=float, default=1e-3, help="the recipe's")
    p.add_argument("--warm-steps", type=int, default=60)
    p.add_argument("--warm-lr", type=float, default=3e-3)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--warm-start-data", metavar="MODEL", default=None, help=argparse.SUPPRESS)
    a = p.parse_args()
    if a.warm_start_data is not None:
        warm_start_data(a.warm_start_data, 32 * a.warm_steps, a.seed)
        return 0
    if not COOKBOOK_PYTHON.exists():
        print(f"no {COOKBOOK_PYTHON.relative_to(ROOT)}: run scripts/setup-tinker-cookbook.sh first", file=sys.stderr)
        return 2

    import rlkit
    from rlkit.tinker_api import TinkerService

    os.chdir(ROOT)
    out = Path(tempfile.mkdtemp(prefix="tinker-cookbook-"))
    env = dict(os.environ, TINKER_TELEMETRY="0", HF_HUB_OFFLINE="1")
    model = out / "nano-warm"
    if a.warm_steps:
        warm_start(a.seed, a.warm_steps, 32, a.warm_lr, model, env)
    session = rlkit.Session.from_config("quickstart_nano", [
        "policy.model_tokenizer=bpe", *([f"policy.model_name={model}"] if a.warm_steps else []),
        "policy.lora_cfg.enabled=true", f"policy.lora_cfg.dim={a.rank}", "policy.max_grad_norm=null",
        "policy.max_total_sequence_length=96", f"seed={a.seed}", f"logger.log_dir={out / 'service'}"])
    service = TinkerService(session).start()
    env.update(TINKER_BASE_URL=service.base_url, TINKER_API_KEY=service.api_key)
    try:
        recipe = [str(COOKBOOK_PYTHON), "-m", "tinker_cookbook.recipes.math_rl.train",
                  f"model_name={session.config.policy.model_name}", "renderer_name=role_colon", "env=arithmetic",
                  f"lora_rank={a.rank}", "loss_fn=importance_sampling", f"group_size={a.group_size}",
                  f"groups_per_batch={a.groups_per_batch}", "max_tokens=8", f"learning_rate={a.learning_rate}",
                  f"max_steps={a.steps}", f"seed={a.seed}", "eval_every=0", "save_every=0",
                  f"log_path={out / 'recipe'}", "behavior_if_log_dir_exists=delete", f"base_url={service.base_url}"]
        print("recipe:", " ".join(recipe[1:]), flush=True)
        with open(out / "recipe.log", "w") as log:  # the cookbook's tables and logs, kept out of the summary
            subprocess.run(recipe, env=env, check=True, stdout=log, stderr=subprocess.STDOUT)
        steps = len(session.history)
    finally:
        service.close()
        session.close()
    rows = [json.loads(line) for line in (out / "recipe" / "metrics.jsonl").read_text().splitlines() if line.strip()]
    rows = [r for r in rows if "env/all/reward/total" in r]
    for i, r in enumerate(rows):
        print(f"step {i}: reward {r['env/all/reward/total']:+.3f} (correct {r['env/all/correct']:.3f}, "
              f"format {r['env/all/format']:.3f})")
    reward = [r["env/all/reward/total"] for r in rows]
    k = max(1, len(reward) // 4)
    first, last = sum(reward[:k]) / k, sum(reward[-k:]) / k
    print(f"first {k} steps {first:+.3f} -> last {k} steps {last:+.3f} ({steps} steps in s.history; logs under {out})")
    return 0 if last > first else 1


if __name__ == "__main__":
    sys.exit(main())
