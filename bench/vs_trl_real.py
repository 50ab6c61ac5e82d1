"""rlkit against TRL's GRPOTrainer on a real pretrained model, SmolLM2-135M-Instruct, one side after the other in
one run: cost per step (``--cost``) or what each learns (``--learn``).

The same on both sides: the model folder (:func:`rlkit.models.pretrained.get_model`: fp32 Llama, tied
embeddings, ChatML, EOS id 2); the task (bench/arith_chat.py: 2-digit addition and subtraction as a user turn,
"What is 47 + 38? Answer with just the number.", 2,000 train rows and 200 disjoint held-out rows, seeded); the
prompts rendered by the model's chat template (TRL's conversational format; rlkit renders them itself), in the
same order (TRL reads a file written in the order rlkit's sampler draws, unshuffled; both sides report the
prompts of each step and the run checks they match); the reward (one function, ``last_number_reward``: TRL's
``reward_funcs=[f]``, rlkit's ``env.reward_fn``); 8 prompts x 8 samples per step, 32 new tokens at most,
temperature 0.7, top-p 1; group-normalized advantages, PPO clip 0.2, token-mean loss, no KL (``beta=0``), one
update per batch, AdamW at a constant learning rate (1e-4 with adapters, 1e-5 with ``--full``), gradient
clipping at 1.0; rank-16 LoRA (alpha 32) on every linear layer of every decoder layer (TRL: peft's
``all-linear``; rlkit: ``policy.lora_cfg``), or ``--full`` weights; fp32; activations recomputed in backward
(TRL's default ``gradient_checkpointing=True``; rlkit's Megatron full recompute, one layer at a time); two torch
threads each (``OMP_NUM_THREADS=2``).

What differs: rlkit generates with vLLM in its process, TRL with transformers' ``generate`` (TRL's vLLM mode
needs vLLM on a GPU or a server: not usable on this CPU); rlkit trains with Megatron-Core, TRL with transformers'
model and peft. Random sampling differs, so the samples differ though their distribution is the same.

``--cost``: completion lengths forced equal, so both sides do the same work per step. TRL with
``generation_kwargs={"min_new_tokens": 32}``. rlkit's ``policy.generation`` has no min_new_tokens, so its side
reads a copy of the model folder whose EOS is ``<empty_output>`` (id 16, a special token the model does not
write) instead of ``<|im_end|>``: it samples on past ``<|im_end|>`` to 32 tokens. The mean completion length of
each side is printed to show it. Reported: CPU-seconds per step (every thread of the side's process, after the
warm-up steps; a shared, loaded machine disturbs it less than wall time), wall seconds per step, peak RSS.

``--learn``: free lengths, N steps (``--steps``, default 15) for each seed (``--seeds 0,1,2``), then held-out
greedy accuracy on the 200 prompts before (the base) and after, measured the same way for both sides: each
side's trained model as an HF folder with the adapters merged (rlkit: ``session.export_hf``; TRL:
``merge_and_unload`` then ``save_pretrained``), scored by transformers' own greedy generate
(:func:`arith_chat.greedy_accuracy`, in rlkit's interpreter for all of them). Timings there are of free-length
steps after the first.

Deliberate simplifications: one process per side and seed, so every side pays its own start-up (not timed);
the seed sets each side's sampling and initialization but not the data, which is the same for every seed;
rlkit starts from the ``smollm2_quickstart`` preset when it exists, else ``math_qwen3``, with the overrides of
:func:`rlkit_overrides` either way.

TRL runs in its own environment, bench/.venv-trl (scripts/setup-bench-trl.sh), never in rlkit's lock.
``--learn --recipe``: after each seed's pair, rlkit's real-model preset as shipped (its own step count, batch size,
dynamic sampling and learning rate; only the model, the task and the seed set as above), exported every 5 steps;
each export's held-out accuracy, and the CPU-seconds of steps until the first export at or above TRL's accuracy
after its 15 steps, against TRL's CPU-seconds for those 15 (its per-step figure times 15).

Usage: python bench/vs_trl_real.py (--cost | --learn [--recipe]) [--full] [--steps N] [--warmup W] [--seeds 0,1,2]
Writes bench/results/vs_trl_real-<mode>-<lora|full>-<time>.json; the last line is
``rlkit/trl cpu_per_step=<x> peak_rss=<y>`` (``--learn`` adds ``heldout_after=<a>/<b>``).
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import shutil
import sys
import tempfile
import time
from pathlib import Path

from arith_chat import make_splits, read_jsonl, write_jsonl
from vs_trl import ROOT, TRL_PYTHON, run_side  # sets OMP_NUM_THREADS=1 for its own sides; set again below

THREADS = 2
os.environ["OMP_NUM_THREADS"] = str(THREADS)  # before torch is imported (rlkit's side imports it in rlkit_side)
os.environ.setdefault("HF_HUB_OFFLINE", "1")

PROMPTS, GENERATIONS, NEW_TOKENS, TEMPERATURE = 8, 8, 32, 0.7
LORA_RANK, LORA_ALPHA, LR_LORA, LR_FULL = 16, 32.0, 1e-4, 1e-5
NUM_TRAIN, NUM_HELDOUT, DATA_SEED = 2000, 200, 0
REWARD = "arith_chat:last_number_reward"
RECIPE_EVERY = 5  # --recipe: steps between the exports evaluated
NO_EOS = "<empty_output>"  # --cost, rlkit's side: the EOS of its folder copy (id 16), which the model never writes
SIDE_ENV = {"OMP_NUM_THREADS": str(THREADS)}


def task_overrides(args) -> dict:
    """The model, the seed, this file's task (data files and reward): all that ``--recipe`` changes in the preset."""
    return {
        "seed": args.seed, "policy.model_name": args.model, "policy.model_preset": None, "sft.enabled": False,
        "data.task": None, "data.dataset_name": None, "data.dataset_config": None, "data.validation_split": None,
        "data.path": args.train, "data.validation_path": args.heldout, "data.prompt_key": "prompt",
        "data.answer_key": "answer", "data.answer_format": "plain", "data.system_prompt": None,
        "env.reward_fn": REWARD}


def rlkit_overrides(args) -> dict:
    """The run config of rlkit's side, over the preset: the workload of the module docstring, and every other
    ``data.*`` and ``env.*`` key the preset sets put back to its default (a preset's prompt template, say, would
    rewrite this file's prompts). ``--recipe``: the preset's own settings, with only :func:`task_overrides`."""
    if getattr(args, "recipe", False):
        ours = task_overrides(args)
        return {**preset_leftovers(rlkit_preset(), ours), **ours}
    ours = {
        **task_overrides(args), "grpo.use_dynamic_sampling": False, "grpo.num_prompts_per_step": PROMPTS,
        "grpo.num_generations_per_prompt": GENERATIONS, "grpo.normalize_rewards": True, "grpo.num_epochs": 1,
        "grpo.advantage_estimator": "grpo", "loss_fn.policy_loss": "ppo_clip", "loss_fn.ratio_clip_min": 0.2,
        "loss_fn.ratio_clip_max": 0.2, "loss_fn.reference_policy_kl_penalty": 0.0,
        "loss_fn.aggregation": "token_mean", "policy.generation.max_new_tokens": NEW_TOKENS,
        "policy.generation.temperature": TEMPERATURE, "policy.generation.top_p": 1.0,
        "policy.generation.top_k": None, "policy.max_total_sequence_length": 128,
        "policy.optimizer.lr": LR_FULL if args.full else LR_LORA, "policy.optimizer.weight_decay": 0.0,
        "policy.scheduler.warmup_steps": 0, "policy.scheduler.decay_style": "constant", "policy.max_grad_norm": 1.0,
        "policy.train_micro_batch_size": PROMPTS * GENERATIONS, "policy.logprob_batch_size": PROMPTS * GENERATIONS,
        "policy.precision": "float32", "policy.generation.vllm_cfg.precision": "float32",
        "policy.generation.vllm_cfg.kv_cache_space_gib": "auto",
        "policy.megatron_cfg.recompute_granularity": "full", "policy.megatron_cfg.recompute_method": "uniform",
        "policy.megatron_cfg.recompute_num_layers": 1,
        "policy.lora_cfg.enabled": not args.full, "policy.lora_cfg.dim": LORA_RANK,
        "policy.lora_cfg.alpha": LORA_ALPHA,
    }
    return {**preset_leftovers(rlkit_preset(), ours), **ours}


def preset_leftovers(preset: str, ours: dict) -> dict:
    """``data.*`` and ``env.*`` keys that ``preset`` sets away from their defaults and ``ours`` does not set, at
    their defaults."""
    import dataclasses

    from rlkit.config.loading import load_config
    from rlkit.config.run import EnvConfig
    from rlkit.data import DataParams

    base = load_config(preset, {"policy.model_name": ours["policy.model_name"]})  # math_qwen3 requires one
    names = {"data": [f.name for f in dataclasses.fields(DataParams)], "env": list(EnvConfig.model_fields)}
    out = {}
    for section, default in (("data", DataParams()), ("env", EnvConfig())):
        for name in names[section]:
            value = getattr(default, name)
            if f"{section}.{name}" not in ours and getattr(getattr(base, section), name) != value:
                out[f"{section}.{name}"] = value
    return out


def rlkit_preset() -> str:
    from rlkit.config.loading import available_presets

    return "smollm2_quickstart" if "smollm2_quickstart" in available_presets() else "math_qwen3"


def rlkit_side(args) -> dict:
    """rlkit's Session on the workload, in this process (a subprocess of this file's main)."""
    import torch

    torch.set_num_threads(THREADS)
    import rlkit

    preset = rlkit_preset()
    s = rlkit.Session.from_config(preset, rlkit_overrides(args))
    if args.recipe:
        return recipe_side(args, s, preset)
    marks = [(time.process_time(), time.perf_counter())]  # the start, then the end of each step
    lengths, prompts = [], []
    for _ in range(args.warmup + args.steps):
        m = s.step()
        marks.append((time.process_time(), time.perf_counter()))
        lengths.append(m["rollout/gen_length_mean"])
        prompts.append([row["prompt"] for row in m.batch.rows] if m.batch is not None else None)
    peak_rss_mb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # before the export below
    if args.merged_out:
        s.export_hf(args.merged_out)
    s.close()
    (c0, w0), (c1, w1) = marks[args.warmup], marks[-1]
    timed = lengths[args.warmup:]
    return {"side": "rlkit", "preset": preset, "cpu_s_per_step": (c1 - c0) / args.steps,
            "wall_s_per_step": (w1 - w0) / args.steps,
            "peak_rss_mb": peak_rss_mb, "threads": torch.get_num_threads(), "steps": len(marks) - 1,
            "completion_tokens_mean": sum(timed) / len(timed), "step_prompts": prompts}


def recipe_side(args, s, preset: str) -> dict:
    """The preset as shipped (its step count, batch, dynamic sampling, learning rate) on this file's task, with the
    trained model exported to ``merged_out/step-<n>`` after every ``RECIPE_EVERY`` steps; the CPU-seconds spent in
    steps up to each export (from the first step, start-up and exports not counted)."""
    steps, cpu, spent, lengths, checkpoints = s.config.grpo.max_num_steps, 0.0, [], [], {}
    for step in range(1, steps + 1):
        start = time.process_time()
        m = s.step()
        cpu += time.process_time() - start
        lengths.append(m["rollout/gen_length_mean"])
        if step % RECIPE_EVERY == 0 or step == steps:
            s.export_hf(Path(args.merged_out) / f"step-{step}")
            checkpoints[step] = cpu
    peak_rss_mb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    s.close()
    return {"side": "rlkit-recipe", "preset": preset, "steps": steps, "cpu_s_by_step": checkpoints,
            "cpu_s_per_step": cpu / steps, "peak_rss_mb": peak_rss_mb, "completion_tokens_mean": mean(lengths)}


def run_recipe(seed: int, model: Path, tmp: Path, trl: dict) -> dict:
    """rlkit's shipped recipe on seed ``seed``: held-out accuracy at each export, and the first export that reaches
    TRL's accuracy after its steps (``trl["after"]``) with the CPU-seconds it took against TRL's."""
    out = tmp / f"recipe-s{seed}"
    side = run_side([sys.executable, __file__, "--side", "rlkit", "--recipe", "--model", str(model), "--train",
                     str(tmp / "train.jsonl"), "--heldout", str(tmp / "heldout.jsonl"), "--seed", str(seed),
                     "--merged-out", str(out)], SIDE_ENV)
    side["accuracy_by_step"] = {int(step): accuracy(out / f"step-{step}", tmp / "heldout.jsonl")["accuracy"]
                                for step in side["cpu_s_by_step"]}
    trl_cpu = trl["cpu_s_per_step"] * trl["steps"]  # its per-step figure (after step 1) times every step trained
    reached = [int(step) for step, acc in side["accuracy_by_step"].items() if acc >= trl["after"]["accuracy"]]
    first = min(reached) if reached else None
    side.update(trl_accuracy=trl["after"]["accuracy"], trl_cpu_s=trl_cpu, reached_at_step=first,
                cpu_s_to_reach=side["cpu_s_by_step"][str(first)] if first else None,
                cpu_ratio_to_reach=side["cpu_s_by_step"][str(first)] / trl_cpu if first else None)
    return side


def report_recipe(recipes: list[dict]) -> dict:
    """Prints the recipe's table; returns its summary."""
    print(f"rlkit's recipe as shipped ({recipes[0]['preset']}, {recipes[0]['steps']} steps), exported every "
          f"{RECIPE_EVERY}: held-out accuracy by step, and the CPU-s to reach TRL's accuracy after its steps")
    for r in recipes:
        by_step = " ".join(f"{k}:{v:.3f}" for k, v in r["accuracy_by_step"].items())
        reach = (f"step {r['reached_at_step']}, {r['cpu_s_to_reach']:.0f} CPU-s vs TRL {r['trl_cpu_s']:.0f} "
                 f"({r['cpu_ratio_to_reach']:.2f}x)" if r["reached_at_step"] else "not reached")
        print(f"  seed {r['seed']}: {by_step}; TRL {r['trl_accuracy']:.3f}: {reach}; peak RSS "
              f"{r['peak_rss_mb']:.0f} MB")
    ratios = [r["cpu_ratio_to_reach"] for r in recipes]
    summary = {"reached": sum(x is not None for x in ratios), "seeds": len(recipes),
               "cpu_ratio_to_reach_mean": mean(ratios) if all(x is not None for x in ratios) else None}
    print(f"recipe reaches TRL's accuracy in {summary['reached']}/{summary['seeds']} seeds; mean CPU ratio "
          + (f"{summary['cpu_ratio_to_reach_mean']:.2f}" if summary["cpu_ratio_to_reach_mean"] else "n/a"))
    return summary


def no_eos_copy(folder: Path, out: Path) -> Path:
    """``folder`` with ``<empty_output>`` as its EOS (weights linked, not copied): generation runs to the limit."""
    from transformers import AutoTokenizer

    out.mkdir(parents=True)
    for f in folder.iterdir():
        (out / f.name).symlink_to(f.resolve()) if f.suffix == ".safetensors" else shutil.copy(f, out / f.name)
    tokenizer = AutoTokenizer.from_pretrained(folder)
    new_id = tokenizer.convert_tokens_to_ids(NO_EOS)
    tokenizer.eos_token = NO_EOS
    tokenizer.save_pretrained(out)
    for name in ("config.json", "generation_config.json"):
        config = json.loads((out / name).read_text())
        config["eos_token_id"] = [new_id] if isinstance(config.get("eos_token_id"), list) else new_id
        (out / name).write_text(json.dumps(config, indent=2))
    return out


def trl_order(train: list[dict], steps: int, seed: int) -> list[dict]:
    """The train rows in the order rlkit's sampler draws them for ``steps`` steps of run seed ``seed``."""
    from rlkit.data.sampler import PromptSampler

    return [train[i] for i in PromptSampler(train, PROMPTS, seed=seed).next_indices(PROMPTS * steps)]


def run_pair(args, seed: int, model: Path, folder: Path, tmp: Path, warmup: int, steps: int, merged: bool) -> dict:
    """Both sides on one seed; with ``merged``, each side's trained model is exported to tmp/<side>-s<seed>."""
    train, heldout = tmp / "train.jsonl", tmp / "heldout.jsonl"
    ordered = write_jsonl(trl_order(read_jsonl(train), warmup + steps, seed), tmp / f"trl-order-s{seed}.jsonl")
    common = ["--steps", str(steps), "--warmup", str(warmup)]
    ours_out, theirs_out = tmp / f"rlkit-s{seed}", tmp / f"trl-s{seed}"
    ours = run_side([sys.executable, __file__, "--side", "rlkit", "--model", str(model), "--train", str(train),
                     "--heldout", str(heldout), "--seed", str(seed), *common, *(["--full"] if args.full else []),
                     *(["--merged-out", str(ours_out)] if merged else [])], SIDE_ENV)
    theirs = run_side([str(TRL_PYTHON), str(ROOT / "bench" / "trl_grpo_side.py"), str(folder), str(ordered),
                       "--prompts", str(PROMPTS), "--generations", str(GENERATIONS), "--max-new-tokens",
                       str(NEW_TOKENS), "--lr", str(LR_FULL if args.full else LR_LORA), *common, "--reward", REWARD,
                       "--temperature", str(TEMPERATURE), "--seed", str(seed), "--no-shuffle",
                       *([] if args.full else ["--lora", str(LORA_RANK), "--lora-alpha", str(LORA_ALPHA)]),
                       *([] if merged else ["--min-new-tokens", str(NEW_TOKENS)]),
                       *(["--merged-out", str(theirs_out)] if merged else [])], SIDE_ENV)
    ours_prompts, theirs_prompts = ours.pop("step_prompts"), theirs.pop("step_prompts")
    same = len(ours_prompts) == len(theirs_prompts) == warmup + steps and all(
        a is not None and sorted(a) == sorted(b) for a, b in zip(ours_prompts, theirs_prompts))
    pair = {"seed": seed, "rlkit": ours, "trl": theirs, "same_prompts_per_step": same}
    if merged:
        pair["rlkit"]["after"] = accuracy(ours_out, heldout)
        pair["trl"]["after"] = accuracy(theirs_out, heldout)
    return pair


def accuracy(folder: Path, rows: Path) -> dict:
    """Held-out greedy accuracy of ``folder`` by transformers (bench/arith_chat.py eval), in a fresh process."""
    return run_side([sys.executable, str(ROOT / "bench" / "arith_chat.py"), "eval", str(folder), str(rows)], SIDE_ENV)


def mean(values: list[float]) -> float:
    return sum(values) / len(values)


def paired_difference(pairs: list[dict]) -> dict:
    """rlkit's held-out accuracy after minus TRL's, seed by seed (both start from the same base): the mean, its
    standard error over the seeds (None with one seed), and one 200-prompt accuracy's own binomial standard error
    at the two sides' mean accuracy, the noise of the evaluation alone. Printed, so that a gap is read against them."""
    diffs = [p["rlkit"]["after"]["accuracy"] - p["trl"]["after"]["accuracy"] for p in pairs]
    m = mean(diffs)
    se = (sum((d - m) ** 2 for d in diffs) / (len(diffs) - 1) / len(diffs)) ** 0.5 if len(diffs) > 1 else None
    n = pairs[0]["rlkit"]["after"]["n"]
    acc = mean([p[side]["after"]["accuracy"] for p in pairs for side in ("rlkit", "trl")])
    eval_se = (acc * (1 - acc) / n) ** 0.5
    print(f"held-out rlkit - TRL by seed: {' '.join(f'{d:+.3f}' for d in diffs)}; mean {m:+.3f}"
          + (f", standard error over seeds {se:.3f}" if se is not None else "")
          + f"; one {n}-prompt accuracy's binomial standard error {eval_se:.3f}")
    return {"by_seed": diffs, "mean": m, "standard_error": se, "eval_binomial_se": eval_se}


def report(args, pairs: list[dict], before: dict | None, load: list[tuple[float, float, float]]) -> dict:
    """Prints the table; returns the figures written to bench/results."""
    mode = "cost (equal lengths)" if args.cost else "learn (free lengths)"
    weights = "full weights" if args.full else f"rank-{LORA_RANK} LoRA (alpha {LORA_ALPHA:g}), every linear layer"
    warmup = pairs[0]["rlkit"]["steps"] - args.steps if args.cost else min(1, args.steps - 1)
    print(f"SmolLM2-135M-Instruct, {mode}, {weights}; {PROMPTS} prompts x {GENERATIONS} samples, {NEW_TOKENS} new "
          f"tokens, T={TEMPERATURE}, {THREADS} threads each; {pairs[0]['rlkit']['steps']} steps per side and seed, "
          f"timed after {warmup}; rlkit preset {pairs[0]['rlkit']['preset']} + overrides")
    print(f"load average (1, 5, 15 min): start {'/'.join(f'{x:.2f}' for x in load[0])}, "
          f"end {'/'.join(f'{x:.2f}' for x in load[-1])}")
    print(f"{'side':<7}{'seed':>5}{'CPU s/step':>12}{'wall s/step':>13}{'peak RSS MB':>13}{'tokens':>8}"
          + (f"{'before':>9}{'after':>8}" if before else ""))
    for p in pairs:
        for side in ("rlkit", "trl"):
            r = p[side]
            print(f"{side:<7}{p['seed']:>5}{r['cpu_s_per_step']:>12.2f}{r['wall_s_per_step']:>13.2f}"
                  f"{r['peak_rss_mb']:>13.0f}{r['completion_tokens_mean']:>8.1f}"
                  + (f"{before['accuracy']:>9.3f}{r['after']['accuracy']:>8.3f}" if before else ""))
    summary = {side: {key: mean([p[side][key] for p in pairs])
                      for key in ("cpu_s_per_step", "wall_s_per_step", "peak_rss_mb", "completion_tokens_mean")}
               for side in ("rlkit", "trl")}
    for side in ("rlkit", "trl"):
        s = summary[side]
        if before:
            s["heldout_after"] = mean([p[side]["after"]["accuracy"] for p in pairs])
        print(f"{side:<7}{'mean':>5}{s['cpu_s_per_step']:>12.2f}{s['wall_s_per_step']:>13.2f}{s['peak_rss_mb']:>13.0f}"
              f"{s['completion_tokens_mean']:>8.1f}"
              + (f"{before['accuracy']:>9.3f}{s['heldout_after']:>8.3f}" if before else ""))
    if before:
        summary["heldout_difference"] = paired_difference(pairs)
    same = all(p["same_prompts_per_step"] for p in pairs)
    print(f"same prompts in every step on both sides: {'yes' if same else 'NO'}")
    ratios = {k: summary["rlkit"][k] / summary["trl"][k] for k in ("cpu_s_per_step", "wall_s_per_step", "peak_rss_mb")}
    line = (f"rlkit/trl cpu_per_step={ratios['cpu_s_per_step']:.2f} wall_per_step={ratios['wall_s_per_step']:.2f} "
            f"peak_rss={ratios['peak_rss_mb']:.2f}")
    if before:
        line += f" heldout_after={summary['rlkit']['heldout_after']:.3f}/{summary['trl']['heldout_after']:.3f}"
    print(line)
    return {"mode": "cost" if args.cost else "learn", "weights": "full" if args.full else "lora",
            "steps": args.steps, "warmup": warmup, "seeds": [p["seed"] for p in pairs],
            "rlkit_preset": pairs[0]["rlkit"]["preset"],
            "threads": THREADS, "load_average_start": load[0], "load_average_end": load[-1],
            "heldout_before": before, "pairs": pairs, "summary": summary, "ratios": ratios,
            "same_prompts_per_step": same}


def main() -> None:
    parser = argparse.ArgumentParser()
    mode = parser.add_mutually_exclusive_group(required=True)
    mode.add_argument("--cost", action="store_true", help="equal completion lengths; CPU-s/step and peak RSS")
    mode.add_argument("--learn", action="store_true", help="free lengths; held-out greedy accuracy before/after")
    mode.add_argument("--side", choices=["rlkit"], help=argparse.SUPPRESS)
    parser.add_argument("--full", action="store_true", help="full weights (lr 1e-5) instead of rank-16 adapters")
    parser.add_argument("--steps", type=int, help="timed steps (--cost, default 4) or steps trained (--learn, 15)")
    parser.add_argument("--warmup", type=int, default=1, help="--cost: untimed steps first")
    parser.add_argument("--recipe", action="store_true",
                        help="--learn: also rlkit's shipped preset as it is, on the same task and seeds")
    parser.add_argument("--seeds", default=None, help="run seeds, comma-separated (--learn default 0,1,2; --cost 0)")
    for hidden in ("--model", "--train", "--heldout", "--merged-out"):
        parser.add_argument(hidden, help=argparse.SUPPRESS)
    parser.add_argument("--seed", type=int, default=0, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.side == "rlkit":
        print(json.dumps(rlkit_side(args)))
        return
    if args.recipe and not args.learn:
        raise SystemExit("--recipe goes with --learn (it compares held-out accuracy)")
    if not TRL_PYTHON.exists():
        raise SystemExit(f"TRL's environment is missing ({TRL_PYTHON}): run scripts/setup-bench-trl.sh first")
    args.steps = args.steps or (4 if args.cost else 15)
    seeds = [int(s) for s in (args.seeds or ("0" if args.cost else "0,1,2")).split(",")]
    from rlkit.config.loading import load_config
    from rlkit.models.pretrained import get_model

    folder = Path(get_model("smollm2-135m-instruct"))
    load = [os.getloadavg()]
    with tempfile.TemporaryDirectory() as name:
        tmp = Path(name)
        train, heldout = make_splits(NUM_TRAIN, NUM_HELDOUT, DATA_SEED)
        write_jsonl(train, tmp / "train.jsonl")
        write_jsonl(heldout, tmp / "heldout.jsonl")
        model = no_eos_copy(folder, tmp / "model-no-eos") if args.cost else folder
        check = argparse.Namespace(seed=seeds[0], model=str(model), train=str(tmp / "train.jsonl"),
                                   heldout=str(tmp / "heldout.jsonl"), full=args.full)
        load_config(rlkit_preset(), rlkit_overrides(check))  # every override problem before any side starts
        before = None if args.cost else accuracy(folder, tmp / "heldout.jsonl")
        warmup, steps = ((args.warmup, args.steps) if args.cost
                         else (min(1, args.steps - 1), args.steps - min(1, args.steps - 1)))
        pairs, recipes = [], []
        for seed in seeds:
            pairs.append(run_pair(args, seed, model, folder, tmp, warmup, steps, merged=args.learn))
            if args.recipe:
                recipes.append({"seed": seed, **run_recipe(seed, model, tmp, pairs[-1]["trl"])})
            load.append(os.getloadavg())
    if args.learn:
        args.steps = warmup + steps  # the table and the JSON count every step trained
    figures = report(args, pairs, before, load)
    if recipes:
        figures["recipe"] = {"seeds": recipes, "summary": report_recipe(recipes)}
    out = (ROOT / "bench" / "results"
           / f"vs_trl_real-{figures['mode']}-{figures['weights']}-{time.strftime('%Y%m%d-%H%M%S')}.json")
    out.write_text(json.dumps(figures, indent=2) + "\n")
    print(f"wrote {out.relative_to(ROOT)}")


if __name__ == "__main__":
    main()
