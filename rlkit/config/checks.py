"""Checks that span sections: combinations that are each valid alone but impossible together.

Every check names the dotted keys involved, the reason and the fix. They run on whichever sections
validated, so a config with a typo elsewhere still gets these reported in the same error.
"""

from __future__ import annotations

import os
import re
import warnings
from dataclasses import replace
from pathlib import Path
from typing import Any, Mapping

from rlkit.config.engines import ENGINES
from rlkit.errors import ModelError
from rlkit.models import PRESETS
from rlkit.models.factory import preset_config, vllm_attention_size, vllm_cpu_family_refusal
from rlkit.models.families import DENSE_FAMILIES, MOE_FAMILIES
from rlkit.models.folder import check_weight_files, num_experts_of, read_json_object
from rlkit.models.pretrained import PRETRAINED
from rlkit.models.tokenizer import tokenizer_vocab_size


def cuda_here() -> bool:
    """Whether this machine has CUDA: asked (torch imported) by the checks whose answer depends on it, last."""
    import torch

    return torch.cuda.is_available()


# transformers' generate: runs any architecture transformers has, at any head size, on the CPU; the engine rlkit
# switches to where vLLM's CPU kernels cannot run the model (generation_fallback)
FALLBACK_ENGINE = "hf"


class EngineFallbackWarning(UserWarning):
    """The one-line notice that validation chose another generation engine than the config's (filterable)."""


def generation_fallback(sections: dict[str, Any], notice: bool = True) -> dict[str, Any]:
    """``sections`` with ``policy.generation.backend`` switched to the transformers generator where the config's
    engine would run on this machine's CPU and its CPU attention kernels lack the model's head size (vLLM's take a
    few sizes only) or its family's row says the engine there does not sample as the policy computes (GPT-OSS), with
    a one-line :class:`EngineFallbackWarning` saying why and how to choose (``notice``).
    Unchanged where the engine can run the model, runs elsewhere (CUDA here, a Ray cluster), or the config sets what
    only the config's engine does (:func:`_fallback_blockers`): :func:`_head_dim_problems` then reports it."""
    policy = sections.get("policy")
    if policy is None or _fallback_blockers(policy):
        return sections
    refused, family_refused = _cpu_refusals(policy, _model_config_of(policy))
    if refused is None and family_refused is None:
        return sections
    if notice:
        why = family_refused  # (without a head size refused: vLLM runs the family here, not as the policy computes it)
        if refused is not None:
            name, size, sizes = refused
            what = "head size" if name == "head_dim" else f"head size {name} ="
            why = (f"{policy.generation.engine.words}'s CPU attention kernels have no {what} {size} (this model's; "
                   f"they take {', '.join(map(str, sizes))})")
        warnings.warn(f"policy.generation.backend={policy.generation.backend}: {why}, so this run generates with "
                      f"{ENGINES[FALLBACK_ENGINE].words} (policy.generation.backend={FALLBACK_ENGINE}); to choose the "
                      f"engine yourself and silence this, set policy.generation.backend={FALLBACK_ENGINE} (or "
                      "megatron: the policy's own weights)", EngineFallbackWarning, stacklevel=4)
    generation = policy.generation.model_copy(update={"backend": FALLBACK_ENGINE})
    return dict(sections, policy=policy.model_copy(update={"generation": generation}))


def _fallback_blockers(policy: Any) -> list[str]:
    """The settings of ``policy.generation`` the fallback engine cannot honour, each with the reason: with any of
    them the config's engine stays, and its refusal of the model is reported as a problem (an explicit choice is not
    silently dropped). Settings that only tune vLLM (KV cache, eager mode, prefix caching) have no meaning without
    it and do not change what is sampled, so they do not block."""
    generation, fallback = policy.generation, ENGINES[FALLBACK_ENGINE]
    out = []
    if generation.vllm_cfg.precision != "float32" and not fallback.reads_vllm_cfg:
        out.append(f"policy.generation.vllm_cfg.precision={generation.vllm_cfg.precision} ({fallback.words} samples "
                   "in float32)")
    if generation.colocated.enabled is False and not fallback.runs_separately:
        out.append(f"policy.generation.colocated.enabled=false ({fallback.words} runs in this process only)")
    return out


def _value_model_backend_problems(policy: Any, critic: Any, reward_model: Any) -> list[str]:
    """``critic.backend=policy`` / ``reward_model.backend=policy`` on a training backend without a value model."""
    if policy is None or policy.backend_section.has_value_model:
        return []
    used = [f"{key}.backend=policy" for key, section in (("critic", critic), ("reward_model", reward_model))
            if section is not None and section.on_policy_backend and (key != "critic" or section.enabled)]
    return [f"{u}: the {policy.backend} backend has no value model yet. Fix: {u.split('=')[0]}=transformers (one "
            "process), or policy.backend=megatron" for u in used]


def cross_section_problems(sections: Mapping[str, Any]) -> list[str]:
    """Problems across ``sections`` (section name -> validated section); checks needing a missing section
    are skipped."""
    out: list[str] = []
    grpo, policy, data, sft, critic = (sections.get(k) for k in ("grpo", "policy", "data", "sft", "critic"))
    if grpo is not None and critic is not None and (grpo.advantage_estimator == "gae") != critic.enabled:
        out.append("grpo.advantage_estimator=gae and critic.enabled go together: GAE reads a learned critic's values, "
                   "and a critic is trained only for GAE; set both (PPO: the `ppo` preset) or neither")
    out += _value_model_backend_problems(policy, critic, sections.get("reward_model"))
    distillation = sections.get("distillation")
    if distillation is not None and distillation.enabled and critic is not None and critic.enabled:
        out.append("distillation.enabled with critic.enabled: the teacher's per-token advantages replace GAE's; "
                   "set critic.enabled=false and grpo.advantage_estimator to a group estimator (e.g. grpo)")
    if grpo is not None and policy is not None:
        samples = grpo.num_prompts_per_step * grpo.num_generations_per_prompt
        global_batch = policy.train_global_batch_size or samples
        if samples % global_batch:
            out.append(f"policy.train_global_batch_size={global_batch}: must divide the samples per step "
                       f"grpo.num_prompts_per_step x grpo.num_generations_per_prompt = {samples}")
        if policy.train_micro_batch_size < global_batch and global_batch % policy.train_micro_batch_size:
            out.append(f"policy.train_micro_batch_size={policy.train_micro_batch_size}: must divide "
                       f"the global batch ({global_batch}); "
                       f"e.g. use {_divisor_near(global_batch, policy.train_micro_batch_size)}")
        out += _data_parallel_problems(policy, "policy.train_global_batch_size", global_batch)
        if policy.generation.max_new_tokens >= policy.max_total_sequence_length:
            out.append(f"policy.generation.max_new_tokens={policy.generation.max_new_tokens}: leaves no room for "
                       f"the prompt in policy.max_total_sequence_length={policy.max_total_sequence_length}")
    if grpo is not None:
        if grpo.use_dynamic_sampling and grpo.num_generations_per_prompt < 2:
            out.append("grpo.use_dynamic_sampling: needs grpo.num_generations_per_prompt >= 2 "
                       "(a group of one has no variance)")
        if grpo.advantage_estimator in ("grpo", "rloo") and grpo.num_generations_per_prompt < 2:
            out.append(f"grpo.num_generations_per_prompt=1: the {grpo.advantage_estimator!r} baseline needs >= 2 "
                       "samples per prompt (or use advantage_estimator=reinforce_baseline)")
    if policy is not None:
        out += policy.backend_problems() + precision_problems(policy) + policy.backend_section.problems(policy)
        out += policy.lora_cfg.problems(policy)
        if policy.generation.colocated.enabled is False and not policy.generation.engine.runs_separately:
            out.append(f"policy.generation.colocated.enabled=false: runs the engine in a Ray actor, which "
                       f"policy.generation.backend={policy.generation.backend!r} cannot; "
                       "set backend=vllm or colocated.enabled=true")
        out += _own_weights_generation_problems(policy, grpo)
        out += _model_problems(policy)
        out += _token_budget_problems(policy, "dynamic_batching") + _token_budget_problems(policy, "sequence_packing")
        out += _sequence_packing_problems(policy)
    if sft is not None and policy is not None and sft.enabled:
        out += _data_parallel_problems(policy, "sft.batch_size", sft.batch_size)
    out += _async_problems(grpo, sections.get("loss_fn"))
    if isinstance(sections.get("name"), str):
        logger = sections.get("logger")
        out += run_name_problems(sections["name"], logger.log_dir if logger is not None else "runs")
    if data is not None:
        out += data.problems()
        out += reasoning_gym_env_problems(data, sections.get("env"))
    # sft.response_key against the data's columns: checked once the data is loaded (builders.check_sft_columns)
    return out


def reasoning_gym_env_problems(data: Any, env: Any) -> list[str]:
    """reasoning-gym's rows are scored by env.name=reasoning_gym (their task's score_answer), and that environment
    scores only such rows: either alone is a run whose rewards are silently wrong (or all failures). A reward of
    yours (env.reward_fn, env.rewards) is not second-guessed."""
    if env is None or env.reward_fn is not None or env.rewards:
        return []
    task = data.task if isinstance(data.task, str) else ""
    if task.startswith("reasoning_gym:") and env.name != "reasoning_gym":
        return [f"env.name={env.name!r}: data.task={task!r} rows are scored by their task's own score_answer, "
                "which env.name=reasoning_gym calls. Fix: set env.name=reasoning_gym (or env.reward_fn to a reward "
                "of yours)"]
    if env.name == "reasoning_gym" and task and not task.startswith("reasoning_gym:"):  # a file may hold such rows
        return [f"env.name='reasoning_gym': it scores rows made by data.task=reasoning_gym:<name> (they carry their "
                f"task and metadata), and data.task={task!r} rows do not. Fix: set data.task=reasoning_gym:<name> "
                "(`rlkit tasks` lists them), or another env.name"]
    return []


def precision_problems(policy: Any) -> list[str]:
    """Precision settings the machine or the engine cannot honour. The generator runs on this machine when
    there is no Ray cluster (``policy.ray_address``), so without CUDA here it runs on the CPU."""
    vllm = policy.generation.vllm_cfg
    key = "policy.generation.vllm_cfg.precision"
    out = []
    if not policy.generation.engine.reads_vllm_cfg and vllm.precision != "float32":
        samples_in = ("the policy's own precision (policy.precision)" if policy.generation.engine.on_policy_weights
                      else "float32")
        out.append(f"{key}={vllm.precision}: only the vLLM generator has a precision setting; "
                   f"policy.generation.backend={policy.generation.backend} samples in {samples_in}. Fix: set it to "
                   "float32 or backend=vllm")
    elif vllm.precision == "fp8" and policy.ray_address is None and not cuda_here():
        out.append(f"{key}=fp8: vLLM's online FP8 weight quantization needs a CUDA GPU (FP8 matmuls: NVIDIA Ada or "
                   "Hopper); this machine has none. Fix: use bfloat16 or float32 here, fp8 on a GPU machine")
    if policy.optimizer.main_params_dtype == "bfloat16" and policy.precision != "bfloat16":
        out.append("policy.optimizer.main_params_dtype=bfloat16: pure bf16 training needs bf16 compute. Fix: set "
                   "policy.precision=bfloat16 too, or main_params_dtype=float32")
    return out


def run_name_problems(name: str, log_dir: str) -> list[str]:
    """A run name is one folder name under ``logger.log_dir``, never a path: ``../../x`` or ``/abs/x`` would
    write (and, on a rerun, replace) records outside the log folder. The folders themselves
    (``logger.log_dir``, ``checkpointing.checkpoint_dir``) may be anywhere the user says."""
    parts = [p for p in re.split(r"[/\\]", name) if p not in ("", ".", "..")]
    if not name.strip() or "\0" in name or not parts:
        return [f"name={name!r}: a run name must be a plain folder name (not blank, '.', '..', nor holding NUL). "
                "Fix: name=my_run"]
    if parts == [name]:
        return []
    parent = Path(name.replace("\\", "/")).parent
    folder = os.path.normpath(parent if parent.is_absolute() else Path(log_dir) / parent)
    return [f"name={name!r}: a run name is one folder name under logger.log_dir, not a path (it holds a path "
            f"separator or '..'). Fix: name={parts[-1]!r}, and choose the folder with logger.log_dir={folder!r}"]


def _async_problems(grpo: Any, loss_fn: Any) -> list[str]:
    """Async GRPO trains on samples from older weights: the loss must correct for it."""
    if grpo is None or loss_fn is None or not grpo.async_grpo.enabled or loss_fn.off_policy_correction != "none":
        return []
    return ["grpo.async_grpo.enabled=true needs an importance-sampling correction against the generator's "
            "logprobs, but loss_fn.off_policy_correction='none'. Fix: set loss_fn.off_policy_correction=tis "
            "(or seq_mask), or grpo.async_grpo.enabled=false"]


def _own_weights_generation_problems(policy: Any, grpo: Any) -> list[str]:
    """An engine that samples from the policy's own model (policy.generation.backend=megatron) needs a training
    backend that offers one, in this process, and no sampling while the same weights train."""
    if not policy.generation.engine.on_policy_weights:
        return []
    key, out = f"policy.generation.backend={policy.generation.backend}", []
    section = policy.backend_section
    if not section.generates_on_own_weights:
        out.append(f"{key}: samples from the policy's own model, which policy.backend={section.name} does not "
                   "offer. Fix: policy.backend=megatron, or generation.backend=vllm (or hf)")
    if policy.num_workers > 1:
        out.append(f"{key}: samples in this process from a policy in one process; with policy.num_workers="
                   f"{policy.num_workers} the model is split over Ray workers (tensor, pipeline or data parallel), "
                   "which this engine does not drive yet. Fix: policy.num_workers=1, or generation.backend=vllm")
    if policy.lora_cfg.releases_base:
        out.append(f"{key}: samples from the policy's frozen base (with its adapters), which "
                   "policy.lora_cfg.release_base_while_generating would release while it samples. Fix: set it to "
                   "false (this engine holds no second copy to take turns with)")
    if grpo is not None and grpo.async_grpo.enabled:
        out.append(f"{key}: async GRPO samples while the policy trains, and this engine samples from the very "
                   "weights being trained. Fix: grpo.async_grpo.enabled=false, or generation.backend=vllm")
    return out


def _model_problems(policy: Any) -> list[str]:
    """Checks against the model: the existing folder's config.json, or the one ``policy.model_preset`` will make."""
    path = Path(policy.model_name) / "config.json"
    preset_config, problems = _preset_config(policy)
    if problems:
        return problems
    if path.is_file():
        try:
            model_config = read_json_object(path, "model config")
            check_weight_files(path.parent)
        except ModelError as exc:
            return [f"policy.model_name={policy.model_name!r}: {exc}"]
        if preset_config is not None and _shape(model_config) != _shape(preset_config):
            # A warning, not an error: pointing a preset's run at one's own model folder is normal use.
            warnings.warn(f"policy.model_name={policy.model_name!r} already holds a different model "
                          f"({_describe(model_config)}) than policy.model_preset={policy.model_preset!r} with "
                          f"policy.model_family={policy.model_family!r} ({_describe(preset_config)}), which is only "
                          "made when the folder does not exist; the existing model is used. To get the preset, "
                          "point policy.model_name at a new folder; to silence this, set policy.model_preset=null",
                          UserWarning, stacklevel=2)
    elif preset_config is not None:
        model_config = preset_config
    else:
        return [f"policy.model_name={policy.model_name!r}: no HF model folder there. Fix: point it at an existing "
                f"folder, or create one: a warm start of a preset with `rlkit sft <preset> --output "
                f"{policy.model_name}` (what quickstart_lora expects: `rlkit sft quickstart --output "
                f"{policy.model_name}`), or random weights with `rlkit make-model {policy.model_name}`"]
    return _head_dim_problems(policy, model_config) + policy.backend_section.model_problems(policy, model_config,
                                                                                            policy.num_workers)


def _head_dim_problems(policy: Any, model_config: Mapping[str, Any]) -> list[str]:
    """vLLM's CPU attention kernels take a few head sizes only; other sizes fail at the first generate, after
    the policy is built. Validation switches such a run to the transformers generator (:func:`generation_fallback`),
    so this is a problem only where the config sets what that engine cannot honour."""
    refused, family_refused = _cpu_refusals(policy, model_config)
    why = "; ".join(_fallback_blockers(policy))
    if refused is None and family_refused is not None:
        return [f"policy.model_name={policy.model_name!r}: {family_refused}. Fix: set policy.generation.backend=hf "
                f"(rlkit switches to backend={FALLBACK_ENGINE} by itself, but not with {why}: drop that to let it)"]
    if refused is None:
        return []
    name, size, sizes = refused
    return [f"policy.model_name={policy.model_name!r}: {name}={size} is not supported by vLLM's CPU attention kernels "
            f"(supported: {', '.join(map(str, sizes))}). Fix: a model whose size is one of those, or set "
            f"policy.generation.backend=hf (rlkit switches to backend={FALLBACK_ENGINE} by "
            f"itself, but not with {why}: drop that to let it)"]


def _cpu_refusals(policy: Any, model_config: Mapping[str, Any] | None) -> tuple[tuple[str, int, tuple] | None,
                                                                              str | None]:
    """Where the config's engine would run on this machine's CPU: the model's attention size its CPU attention kernels
    lack (:func:`rlkit.models.factory.vllm_attention_size`: its name, value and the values the kernels take), and why
    it does not sample the model's family as the policy computes it
    (:func:`rlkit.models.factory.vllm_cpu_family_refusal`); each None where there is no such refusal. The engine runs
    on this machine's CPU when there is no GPU here and no Ray cluster (``policy.ray_address``) whose machines this
    check cannot see; torch is imported (to ask about CUDA) only for a model the CPU engine refuses."""
    if model_config is None or not policy.generation.engine.cpu_head_dims_limited or policy.ray_address is not None:
        return None, None
    name, size, sizes = vllm_attention_size(model_config)
    family = vllm_cpu_family_refusal(model_config)
    if (size in sizes and family is None) or cuda_here():
        return None, None
    return (None if size in sizes else (name, size, sizes)), family


def _model_config_of(policy: Any) -> Mapping[str, Any] | None:
    """The HF config the run will load (the folder's, else the one its preset makes), or None where there is none
    or it is unreadable (:func:`_model_problems` reports why)."""
    path = Path(policy.model_name) / "config.json"
    if path.is_file():
        try:
            return read_json_object(path, "model config")
        except ModelError:
            return None
    return _preset_config(policy)[0]


def _preset_config(policy: Any) -> tuple[dict | None, list[str]]:
    """The HF config ``policy.model_preset`` makes (None without a preset), or the problems with the preset."""
    if policy.model_preset is None:
        return None, []
    if policy.model_preset in PRETRAINED:  # its config is known before the package's file is converted
        return dict(PRETRAINED[policy.model_preset].config), []
    if policy.model_preset not in PRESETS:
        return None, [f"policy.model_preset={policy.model_preset!r}: unknown; choose one of {sorted(PRESETS)} "
                      f"(random tiny models) or {sorted(PRETRAINED)} (pretrained)"]
    spec = PRESETS[policy.model_preset]
    if (spec.num_experts > 0) != (policy.model_family in MOE_FAMILIES):
        return None, [f"policy.model_family={policy.model_family!r}: preset {policy.model_preset!r} needs one of "
                      f"the families {', '.join(MOE_FAMILIES if spec.num_experts else DENSE_FAMILIES)}"]
    spec = replace(spec, vocab_size=max(spec.vocab_size, tokenizer_vocab_size(policy.model_tokenizer)))  # as made
    return preset_config(spec, policy.model_family), []


def _shape(model_config: Mapping[str, Any]) -> tuple:
    return (tuple(model_config.get("architectures") or ()), model_config.get("hidden_size"),
            model_config.get("num_hidden_layers"), model_config.get("num_attention_heads"),
            num_experts_of(model_config))


def _describe(model_config: Mapping[str, Any]) -> str:
    arch = "/".join(model_config.get("architectures") or ["?"])
    experts = f", {num_experts_of(model_config)} experts" if num_experts_of(model_config) else ""
    return (f"{arch}, hidden {model_config.get('hidden_size')}, {model_config.get('num_hidden_layers')} layers, "
            f"{model_config.get('num_attention_heads')} heads{experts}")


def _data_parallel_problems(policy: Any, key: str, rows: int) -> list[str]:
    """The ``rows`` of one optimizer step (``key``'s value) split evenly over the data-parallel ranks, and with
    pipeline parallelism each rank's share into equal microbatches."""
    dp, micro = policy.backend_section.data_parallel_size(policy.num_workers), policy.train_micro_batch_size
    if rows % dp:
        return [f"{key}={rows}: must be a multiple of the data-parallel size {dp} (policy.num_workers="
                f"{policy.num_workers} / model-parallel ranks)"]
    if policy.backend_section.pipelined() and rows // dp > micro and (rows // dp) % micro:
        return [f"{key}={rows}: each data-parallel rank's {rows // dp} rows must be a multiple of "
                f"policy.train_micro_batch_size={micro} (pipeline parallelism runs equal microbatches)"]
    return []


def _divisor_near(n: int, target: int) -> int:
    return min((d for d in range(1, n + 1) if n % d == 0), key=lambda d: abs(d - target))


def _token_budget_problems(policy: Any, name: str) -> list[str]:
    """``policy.<name>`` (dynamic_batching or sequence_packing), when enabled: a budget must hold one whole
    sequence, and Megatron's pipeline schedule runs microbatches of one shape [rows, length] only."""
    section = getattr(policy, name)
    if not section.enabled:
        return []
    out = [f"policy.{name}.{key}={budget}: smaller than one sequence (policy.max_total_sequence_length="
           f"{policy.max_total_sequence_length}); raise it to at least that, or leave it unset"
           for key, budget in (("train_mb_tokens", section.train_mb_tokens),
                               ("logprob_mb_tokens", section.logprob_mb_tokens))
           if budget is not None and budget < policy.max_total_sequence_length]
    if policy.backend_section.pipelined():
        out.append(f"policy.{name}.enabled: not with pipeline parallelism (Megatron's schedule runs microbatches "
                   "of one shape); set it false or policy.megatron_cfg.pipeline_model_parallel_size=1")
    return out


def _sequence_packing_problems(policy: Any) -> list[str]:
    """Beyond the budget rules: packing replaces dynamic batching (NeMo-RL: the two are exclusive). (Context
    parallelism is refused for every run: see the layout checks.)"""
    if not (policy.sequence_packing.enabled and policy.dynamic_batching.enabled):
        return []
    return ["policy.sequence_packing.enabled: exclusive with policy.dynamic_batching.enabled (packing already "
            "leaves no padding); set one of them false"]
