"""Fixtures for the tracking tests: a nano model with a little SFT (so RL steps have reward signal) and
a tiny run config around it."""

import pytest

import rlkit

# 1-digit addition, 4 prompts x 4 samples per step, 16 held-out prompts: an RL step takes about a second.
TINY = [
    "policy.model_preset=nano",
    "data.digits=1",
    "data.num_train=200",
    "data.num_validation=16",
    "eval.num_prompts=16",
    "grpo.num_prompts_per_step=4",
    "grpo.num_generations_per_prompt=4",
    "grpo.max_num_steps=4",
    "policy.train_micro_batch_size=16",
    "policy.logprob_batch_size=16",
    "policy.optimizer.lr=3e-4",
    "policy.scheduler.warmup_steps=0",
    "sft.enabled=false",
    "grpo.use_dynamic_sampling=false",
    "logger.sample_table_period=0",
]


def deterministic(metrics):
    """The metrics a rerun must reproduce: all but the wall-clock ones, which all live under ``timing/``."""
    return {k: v for k, v in metrics.items() if not k.startswith("timing/")}


def tiny_overrides(model, log_dir, *extra):
    return [f"policy.model_name={model}", f"logger.log_dir={log_dir}", *TINY, *extra]


def tiny_config(model, log_dir, *extra):
    return rlkit.load_config("quickstart", tiny_overrides(model, log_dir, *extra))


@pytest.fixture(scope="session")
def warm_model(model_factory, tmp_path_factory):
    """A nano llama after 30 SFT steps on 1-digit addition (about 10-40% reward at temperature 1), made
    with the policy alone (no generator), exported as an HF folder."""
    from transformers import AutoTokenizer

    from rlkit.builders import build_policy
    from rlkit.data import PromptSampler, load_prompt_dataset
    from rlkit.stages import SFTSettings, WarmStart, sft
    from rlkit.tracking.export import export_hf_folder

    base = model_factory("nano")
    out = tmp_path_factory.mktemp("warm") / "nano-sft"
    cfg = tiny_config(base, out.parent, "sft.num_steps=30", "sft.lr=1e-2", "sft.batch_size=16", "sft.warmup_steps=5")
    policy = build_policy(cfg)
    try:
        sampler = PromptSampler(load_prompt_dataset(cfg.data)["train"], cfg.sft.batch_size, seed=1)
        sft(policy, AutoTokenizer.from_pretrained(base), WarmStart(sampler), SFTSettings.from_config(cfg))
        export_hf_folder(policy, base, out)
    finally:
        policy.close()
    return out
