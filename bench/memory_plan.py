"""The memory plan (:mod:`rlkit.memory.plan`) against measured peak RSS of short GRPO runs on the CPU.

    .venv/bin/python bench/memory_plan.py                  # tiny (quickstart model), qwen3-0.6b-4l, qwen3-0.6b
    .venv/bin/python bench/memory_plan.py --sizes tiny qwen3-0.6b-4l
    .venv/bin/python bench/memory_plan.py --sizes qwen3-0.6b --extra policy.precision=bfloat16 \
        policy.generation.vllm_cfg.precision=bfloat16 policy.lora_cfg.enabled=true policy.lora_cfg.dim=16

Each size runs in its own process under ``/usr/bin/time -v`` (peak RSS of that process: the policy and the
in-process vLLM engine share it): a session from the quickstart config with the size's model folder, no SFT,
2 prompts x 4 samples, 2 GRPO steps. The 0.6B shapes are transformers' ``Qwen3Config`` with the published
Qwen3-0.6B values (hidden 1024, 16/8 heads, head_dim 128, vocabulary 151,936, tied embeddings; 28 layers, or 4),
random weights saved in bf16 safetensors under /tmp, with rlkit's byte-level BPE tokenizer (512 tokens: the ids
a run uses are a subset of the model's vocabulary). ``--extra`` adds config overrides to every size (bf16,
adapters). Prints one row per size: plan, measured, ratio, peak bytes per model parameter, load.

Also holds the published configs of Qwen3-8B and Qwen3-32B (``QWEN3``) for the README's plans on H200s
(``--h200``), which need no download.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

QWEN3_06B = dict(model_type="qwen3", hidden_size=1024, intermediate_size=3072, num_hidden_layers=28,
                 num_attention_heads=16, num_key_value_heads=8, head_dim=128, vocab_size=151936,
                 tie_word_embeddings=True, max_position_embeddings=40960, rope_theta=1000000, rms_norm_eps=1e-6)
QWEN3 = {  # published config.json values (Qwen/Qwen3-8B, Qwen/Qwen3-32B)
    "Qwen3-8B": dict(QWEN3_06B, hidden_size=4096, intermediate_size=12288, num_hidden_layers=36,
                     num_attention_heads=32, num_key_value_heads=8, tie_word_embeddings=False),
    "Qwen3-32B": dict(QWEN3_06B, hidden_size=5120, intermediate_size=25600, num_hidden_layers=64,
                      num_attention_heads=64, num_key_value_heads=8, tie_word_embeddings=False),
}
WORKLOAD = ["sft.enabled=false", "grpo.num_prompts_per_step=2", "grpo.num_generations_per_prompt=4",
            "grpo.use_dynamic_sampling=false", "policy.generation.max_new_tokens=16",
            "policy.max_total_sequence_length=64", "policy.train_micro_batch_size=8", "policy.logprob_batch_size=8",
            "policy.generation.vllm_cfg.kv_cache_space_gib=0.25"]
STEPS = 2


def make_qwen3_shape(folder: Path, layers: int) -> Path:
    """A random Qwen3-0.6B-shaped model with ``layers`` layers, bf16 safetensors, rlkit's BPE tokenizer."""
    if (folder / "config.json").is_file():
        return folder
    import shutil

    import torch
    from transformers import AutoModelForCausalLM, Qwen3Config

    from rlkit.models import make_model

    values = {k: v for k, v in QWEN3_06B.items() if k != "model_type"}
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(Qwen3Config(**dict(values, num_hidden_layers=layers)),
                                             dtype=torch.bfloat16)
    model.save_pretrained(folder)
    del model
    with tempfile.TemporaryDirectory() as tmp:
        tiny = make_model(Path(tmp) / "t", "nano", "qwen3", tokenizer="bpe")
        for f in Path(tiny).iterdir():
            if "token" in f.name or f.name.endswith(".jinja"):
                shutil.copy(f, folder / f.name)
    return folder


def folders(sizes: list[str], root: Path) -> dict[str, Path]:
    from rlkit.models import make_model

    out = {}
    for size in sizes:
        if size == "tiny":
            out[size] = Path(make_model(root / "tiny", "tiny", "llama")) if not (root / "tiny/config.json").is_file() \
                else root / "tiny"
        else:
            out[size] = make_qwen3_shape(root / size, 4 if size.endswith("-4l") else 28)
    return out


CHILD = """
import sys
from rlkit.session import Session
s = Session.from_config("quickstart", sys.argv[1:])
s.run({steps}, progress=False)
s.close()
"""


def measure(folder: Path, extra: list[str]) -> tuple[int, float]:
    """Peak RSS (bytes) of a short run on ``folder``, and the 1-minute load average when it started."""
    env = dict(os.environ, HF_HUB_OFFLINE="1", HF_DATASETS_OFFLINE="1", WANDB_MODE="offline",
               TOKENIZERS_PARALLELISM="false", PYTHONPATH=str(ROOT))
    load = os.getloadavg()[0]
    args = ["/usr/bin/time", "-v", sys.executable, "-c", CHILD.format(steps=STEPS), *overrides(folder, extra)]
    done = subprocess.run(args, env=env, capture_output=True, text=True, cwd=ROOT)
    if done.returncode != 0:
        raise RuntimeError(done.stderr[-3000:])
    kb = int(re.search(r"Maximum resident set size \(kbytes\): (\d+)", done.stderr).group(1))
    return kb * 1024, load


def overrides(folder: Path, extra: list[str]) -> list[str]:
    return [f"policy.model_name={folder}", "policy.model_preset=null", *WORKLOAD, *extra]


def planned(folder: Path, extra: list[str]) -> int:
    from rlkit.config.loading import load_config
    from rlkit.memory.plan import plan_memory

    return plan_memory(load_config("quickstart", overrides(folder, extra))).total


def h200_plans() -> str:
    """The plans of Qwen3-8B and -32B (math_qwen3's workload) on one and on eight H200s."""
    from rlkit.config.loading import load_config
    from rlkit.memory.plan import Device, plan_memory
    from rlkit.models import make_model

    with tempfile.TemporaryDirectory() as tmp:
        folder = make_model(Path(tmp) / "m", "nano", "qwen3", hidden_size=256, num_attention_heads=8, num_key_value_heads=8)  # (validation wants a folder, TP=8 whole KV groups; the plan reads QWEN3)
        h200 = Device("cuda", int(139 * 2**30), "H200 (139 GiB)")
        out = []
        for name, hf in QWEN3.items():
            for workers, extra in ((1, []), (8, ["policy.num_workers=8", "policy.megatron_cfg.tensor_model_parallel_size=8"])):
                bf16 = ["policy.precision=bfloat16", "policy.generation.vllm_cfg.precision=bfloat16"]
                for label, more in (("full, bf16", bf16),
                                    ("full, pure bf16", [*bf16, "policy.optimizer.main_params_dtype=bfloat16"]),
                                    ("LoRA r16, bf16", ["policy.precision=bfloat16", "policy.generation.vllm_cfg.precision=bfloat16",
                                                         "policy.lora_cfg.enabled=true", "policy.lora_cfg.dim=16"])):
                    cfg = load_config("math_qwen3", [f"policy.model_name={folder}", *extra, *more])
                    plan = plan_memory(cfg, hf, h200)
                    out.append(f"### {name}, {workers} x H200, {label}\n```\n{plan.table()}\n```")
        return "\n".join(out)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sizes", nargs="+", default=["tiny", "qwen3-0.6b-4l", "qwen3-0.6b"])
    parser.add_argument("--root", default="/tmp/rlkit-memory-plan")
    parser.add_argument("--extra", nargs="*", default=[], help="config overrides for every size (key=value)")
    parser.add_argument("--h200", action="store_true", help="print the Qwen3-8B/32B plans on H200s and exit")
    args = parser.parse_args(argv)
    if args.h200:
        print(h200_plans())
        return 0
    from rlkit.models.factory import count_parameters

    rows = []
    for size, folder in folders(args.sizes, Path(args.root)).items():
        plan = planned(folder, args.extra)
        peak, load = measure(folder, args.extra)
        rows.append({"size": size, "extra": " ".join(args.extra), "plan_gib": plan / 2**30,
                     "peak_rss_gib": peak / 2**30, "plan/peak": plan / peak,
                     "peak_bytes_per_param": peak / count_parameters(folder), "load1": load})
        print(json.dumps(rows[-1]), flush=True)
    return 0 if all(abs(r["plan/peak"] - 1) <= 0.15 for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
