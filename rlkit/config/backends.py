"""The training backends' config sections, ``policy.<name>_cfg``: settings, rules, words and memory facts, which
validation, the memory plan and the start line read without importing the backend (:mod:`rlkit.policy.backends`
builds it). A new backend: a section here, in :data:`BACKEND_SECTIONS`, and its field of ``PolicyConfig``."""

from __future__ import annotations

from typing import Any, ClassVar, Literal, Mapping, Optional

from pydantic import Field

from rlkit.config.checks import cuda_here
from rlkit.config.section import Section
from rlkit.models.folder import num_experts_of


# Megatron's fused linear layers by the HF projections they hold (either name goes in policy.lora_cfg)
LORA_FUSED_MODULES = {"linear_qkv": ("q_proj", "k_proj", "v_proj"), "linear_proj": ("o_proj",),
                      "linear_fc1": ("gate_proj", "up_proj"), "linear_fc2": ("down_proj",)}
# the module a checkpoint that stores them fused (Phi-3) has for each of those linears
CHECKPOINT_FUSED_MODULES = {"linear_qkv": "qkv_proj", "linear_fc1": "gate_up_proj"}


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
    # offers a generator on its own weights (policy.generation.backend=megatron: rlkit.policy.megatron.generator)
    generates_on_own_weights: ClassVar[bool] = False
    # a value model on it (critic.backend=policy, reward_model.backend=policy: rlkit.policy.value_model's registry)
    has_value_model: ClassVar[bool] = False

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

    def lora_problems(self, targets: set[str], fused: bool) -> list[str]:
        """What this backend cannot do with adapters on the HF projections ``targets`` (``fused``: one adapter
        per fused linear, ``policy.lora_cfg.fused_adapters``)."""
        if fused:
            return [f"policy.lora_cfg.fused_adapters=true: one adapter over a fused linear is Megatron's layout; the "
                    f"{self.name} backend puts peft's adapters on each HF projection (set it to false, or use "
                    f"policy.backend=megatron)"]
        return []

    def data_parallel_size(self, num_workers: int) -> int:
        """Ranks that hold different rows of a batch."""
        return num_workers

    def layout_words(self, num_workers: int) -> str:
        """The parallel layout in words (the session card)."""
        raise NotImplementedError

    def single_process(self) -> "BackendSection":
        """These settings for one process (a distillation teacher beside a policy in Ray workers): no model
        parallelism."""
        return self

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
    keeps_bf16_twin = unfused_attention_on_cpu = releases_frozen_base = generates_on_own_weights = True
    has_value_model = True
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

    def single_process(self) -> "MegatronConfig":
        return self.model_copy(update={"tensor_model_parallel_size": 1, "pipeline_model_parallel_size": 1,
                                       "context_parallel_size": 1, "expert_model_parallel_size": 1,
                                       "expert_tensor_parallel_size": None, "sequence_parallel": False})

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

    def lora_problems(self, targets: set[str], fused: bool) -> list[str]:
        out = []
        if self.pipeline_model_parallel_size > 1:
            out.append("policy.lora_cfg.enabled: adapters under pipeline parallelism are not built yet; set "
                       "policy.megatron_cfg.pipeline_model_parallel_size=1 (tensor parallelism works)")
        for linear, parts in LORA_FUSED_MODULES.items():
            if fused and 0 < len(targets & set(parts)) < len(parts):
                out.append(f"policy.lora_cfg.target_modules: with fused_adapters one adapter spans {linear} "
                           f"({', '.join(parts)}); name all of them (or {linear}), or none, or set "
                           f"policy.lora_cfg.fused_adapters=false for one adapter per projection")
        return out

    def problems(self, policy: "PolicyConfig") -> list[str]:
        return distributed_optimizer_problems(policy) + expert_packing_problems(policy) + self.recompute_problems()

    def model_problems(self, policy: "PolicyConfig", model_config: Mapping[str, Any], world_size: int) -> list[str]:
        return parallel_layout_problems(self, model_config, world_size)


class DTensorConfig(BackendSection):
    """PyTorch's FSDP2 over every rank (:mod:`rlkit.policy.dtensor`)."""

    name, title, start_words = "dtensor", "DTensor (FSDP2)", "DTensor, FSDP2"
    has_value_model = True
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
    has_value_model = True
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


BACKEND_SECTIONS = (MegatronConfig, DTensorConfig, HFPolicyConfig)  # rlkit.policy.backends builds each
BackendName = Literal[tuple(s.name for s in BACKEND_SECTIONS)]  # type: ignore[valid-type]


def parallel_layout_problems(megatron_cfg: Any, model_config: Mapping[str, Any], world_size: int = 1) -> list[str]:
    """Rules a Megatron layout must satisfy for a model (heads, query groups, vocabulary, layers, world)."""
    tp = megatron_cfg.tensor_model_parallel_size
    pp = megatron_cfg.pipeline_model_parallel_size
    cp = megatron_cfg.context_parallel_size
    key = "policy.megatron_cfg"
    heads = model_config["num_attention_heads"]
    groups = model_config.get("num_key_value_heads") or heads
    out = []
    if heads % tp:
        out.append(f"{key}.tensor_model_parallel_size={tp}: must divide num_attention_heads={heads}")
    if groups % tp:
        out.append(f"{key}.tensor_model_parallel_size={tp}: must divide num_key_value_heads={groups} "
                   "(each rank holds whole KV groups)")
    if model_config["vocab_size"] % tp:
        out.append(f"{key}.tensor_model_parallel_size={tp}: must divide vocab_size={model_config['vocab_size']}")
    if model_config["num_hidden_layers"] % pp:
        out.append(f"{key}.pipeline_model_parallel_size={pp}: must divide num_hidden_layers="
                   f"{model_config['num_hidden_layers']}")
    if cp > 1:
        out.append(f"{key}.context_parallel_size={cp}: context parallelism needs Transformer Engine's attention "
                   "(Megatron's local attention refuses it), and rlkit builds the local layer spec; use 1")
    if megatron_cfg.sequence_parallel and tp == 1:
        out.append(f"{key}.sequence_parallel: needs tensor_model_parallel_size > 1")
    experts = num_experts_of(model_config)
    ep, etp = megatron_cfg.expert_model_parallel_size, megatron_cfg.expert_tensor_parallel_size
    if ep > 1 and not experts:
        out.append(f"{key}.expert_model_parallel_size={ep}: needs a Mixture-of-Experts model (this one has no experts)")
    elif experts and experts % ep:
        out.append(f"{key}.expert_model_parallel_size={ep}: must divide num_local_experts={experts}")
    if ep > 1 and world_size % (ep * pp):
        out.append(f"{key}.expert_model_parallel_size={ep}: expert x pipeline = {ep * pp} must divide the world "
                   f"size {world_size} (policy.num_workers)")
    if experts and tp > 1 and not megatron_cfg.sequence_parallel:
        out.append(f"{key}.tensor_model_parallel_size={tp}: Megatron's MoE layer trains with tensor parallelism only "
                   f"together with sequence parallelism; set {key}.sequence_parallel=true")
    if etp is not None and etp != tp:
        out.append(f"{key}.expert_tensor_parallel_size={etp}: only the default (= tensor_model_parallel_size={tp}) "
                   "is supported; leave it unset")
    model_parallel = tp * pp * cp
    if world_size % model_parallel:
        out.append(f"{key}: tensor x pipeline x context = {model_parallel} must divide the world size {world_size}")
    return out


def distributed_optimizer_problems(policy: Any) -> list[str]:
    """Megatron's distributed optimizer (ZeRO-1) needs CUDA: ``DistributedOptimizer`` accepts only
    ``torch.cuda.*Tensor`` parameters (megatron-core 0.16.1 ``optimizer/distrib_optimizer.py:361,420``, a
    TypeError for CPU tensors) and its mixed-precision base allocates ``device='cuda'`` tensors
    (``optimizer/optimizer.py:473,481,485``). On a GPU it is refused too, for now: rlkit's step (clipping, the
    learning-rate schedule, checkpoints of the optimizer state) is written for one AdamW over whole tensors
    and has not been ported to sharded state. Megatron's DistributedDataParallel runs everywhere (gloo too)."""
    if not policy.megatron_cfg.optimizer.use_distributed_optimizer:
        return []
    key = "policy.megatron_cfg.optimizer.use_distributed_optimizer=true"
    if not cuda_here():
        return [f"{key}: needs CUDA, which this machine lacks: Megatron's distributed optimizer (megatron-core "
                "0.16.1 optimizer/distrib_optimizer.py:361,420 accept only torch.cuda tensors; optimizer/optimizer.py:"
                "473-485 allocate on 'cuda'). Fix: set it false (gradients still go through Megatron's "
                "DistributedDataParallel)"]
    return [f"{key}: not built yet: rlkit's optimizer step (clipping, schedule, optimizer-state checkpoints) runs "
            "one AdamW over whole tensors, not Megatron's sharded optimizer state. Fix: set it false (gradients "
            "still go through Megatron's DistributedDataParallel)"]


def expert_packing_problems(policy: Any) -> list[str]:
    """Megatron's expert dispatch needs equal token counts per rank, which packs do not have."""
    if policy.sequence_packing.enabled and policy.megatron_cfg.expert_model_parallel_size > 1:
        return ["policy.sequence_packing.enabled: not with expert parallelism (Megatron's all-gather token "
                "dispatcher needs as many tokens from every expert-parallel rank, and packs differ in length); "
                "set it false or policy.megatron_cfg.expert_model_parallel_size=1"]
    return []
