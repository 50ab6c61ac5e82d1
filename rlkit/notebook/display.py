"""Text and HTML summaries of sessions and batches. They read attributes only: no compute, no I/O."""

from __future__ import annotations

from typing import Any

from rlkit.notebook.html import key_values, table


def session_facts(s: Any) -> dict[str, object]:
    cfg = s.config
    if s.policy is None:
        return {"state": "closed"}
    mc = cfg.policy.megatron_cfg
    return {
        "model": f"{cfg.policy.model_name} ({s.policy.arch.family}, {s.policy.arch.num_layers} layers x {s.policy.arch.hidden_size})",
        "policy": f"Megatron-Core, TP={mc.tensor_model_parallel_size} PP={mc.pipeline_model_parallel_size} "
                  f"CP={mc.context_parallel_size} EP={mc.expert_model_parallel_size}, device=cpu",
        "environment": getattr(s.env, "name", type(s.env).__name__),
        "step": s.step_count,
        "policy version": s.policy.version,
        "generator": f"{cfg.policy.generation.backend} (colocated), holds version {s.generator_version}"
                     + (" (STALE: call refit())" if s.stale else " (in sync)"),
        "last reward": f"{s.history[-1]['rollout/reward_mean']:.3f}" if s.history else "-",
    }


def session_summary(s: Any) -> str:
    facts = session_facts(s)
    return "Session(" + ", ".join(f"{k}={v}" for k, v in facts.items()) + ")"


def session_html(s: Any) -> str:
    return key_values("rlkit Session", session_facts(s))
