"""The memory a run config will need, per device and per part, before anything loads.

Why: a config that cannot fit should fail in a second with the numbers and the switch that helps, not after
minutes of loading with an out-of-memory kill. The plan reads the model folder's ``config.json`` alone: the
model is built on the meta device (transformers' own class, so every family counts its own parameters exactly)
and no weight is read.

The parts, for the busiest device (rank 0, which also hosts a colocated engine):

- weights: the trained model's master weights (fp32; bf16 with ``policy.optimizer.main_params_dtype=bfloat16``),
  this device's shard (Megatron: / TP x PP; FSDP2: / ranks);
  with adapters the frozen base, fp32 (Megatron at bf16: held once, in bf16, as the compute copy);
- bf16 twin: Megatron's bf16 compute copy at ``policy.precision=bfloat16`` (FSDP2: one gathered layer in bf16);
- gradients and optimizer state (AdamW: two moments) of what trains (all weights, or the adapters), in the
  masters' dtype;
- reference: a copy of the weights while the loss reads a reference (KL penalty, KL in the reward), none with
  adapters (the base is the reference);
- adapters: the LoRA matrices, fp32;
- activations kept for backward at the configured micro batch and sequence length (all layers, or with
  recompute only each layer's input plus one layer's worth);
- logits of the vocabulary: fp32 logits, scaled, their log-softmax and its gradient for one micro batch (/ TP);
  Megatron without pipeline stages fuses its head with the logprobs (:mod:`rlkit.policy.megatron.head`) when
  those exceed one chunk: then a chunk's logits, softmax and gradient (``policy.megatron_cfg.fused_head_chunk_mib``
  each) and the head weight's gradient;
- optimizer step: AdamW's foreach temporaries, one fp32 copy of what trains;
- weight snapshots: ``history.snapshots`` copies of what trains (the adapters; all weights only with
  ``history.full_weight_snapshots``), the states ``session.replay`` starts from (:mod:`rlkit.run.history`);
- engine weights and KV cache: the generator's copy of the model in its precision, and its cache (the CPU:
  ``vllm_cfg.kv_cache_space_gib``, by default what the rollout batch needs, :func:`kv_cache_bytes`; CUDA:
  ``gpu_memory_utilization`` of the device, less its weights; on the CPU the output head's prepacked kernel is a
  second copy of its table, and while it loads the input embedding's a third (dropped after the load); with ``vllm_cfg.release_weights_for_training`` only what exceeds the train step's
  activations, logits, optimizer temporaries and gradients, which never coexist with the engine's weights, and with
  ``lora_cfg.release_base_while_generating`` beyond the frozen base too);
- critic: PPO's value model (``critic.enabled``, :mod:`rlkit.policy.critic`): its parameters (the LM's with a scalar
  head for the LM head, :mod:`rlkit.memory.value_models`) in fp32 with their gradients, AdamW's two moments and its
  step temporaries (20 B a parameter; unsharded on transformers, a TP shard with ``critic.backend=policy`` beside an
  in-process policy), and its activations at ``critic.micro_batch_size`` rows;
- teacher: on-policy distillation's frozen teacher (``distillation.enabled``): its weights as the policy holds its
  own (no gradients, no optimizer state);
- runtime: what the libraries themselves hold (torch, vLLM, Megatron, transformers: measured on the CPU, see
  ``bench/memory_plan.py``; the CUDA context on a GPU).

Deliberate simplifications: activations by a per-layer element count of the dense decoder (attention scores
included, as the CPU's unfused attention keeps them); allocator fragmentation and transient copies are not
modelled (the CPU check in ``tests/memory`` holds the plan to 15% of measured peak RSS); MoE models are counted
as their full parameter set.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from typing import Any, Mapping, Optional

from rlkit.config.backends import CHECKPOINT_FUSED_MODULES, LORA_FUSED_MODULES
from rlkit.config.engines import BYTES_PER_PARAMETER, engine_handoff
from rlkit.config.run import RunConfig
from rlkit.errors import ConfigError
from rlkit.memory.value_models import value_model_bytes, value_model_parameters
from rlkit.models.factory import head_dim_of
from rlkit.units import bytes_text, count_text

GIB = 2**30
CPU_KV_BLOCK_TOKENS = 128  # vLLM's KV-cache block on the CPU (vllm/platforms/cpu.py): a sequence takes whole blocks
RUNTIME_CPU_BYTES = int(0.8 * GIB)  # torch + vLLM + Megatron + transformers imported, an engine started (bench/memory_plan.py)
RUNTIME_CUDA_BYTES = int(0.75 * GIB)  # CUDA context and library workspaces per device
SKIP_ENV = "RLKIT_SKIP_MEMORY_PLAN"  # set to 1 to start a config the plan refuses (you know better)


class MemoryPlanError(ConfigError):
    """A config whose plan does not fit the device it would run on."""


@dataclass(frozen=True)
class ModelShape:
    """What the plan needs of a model: counts from its meta-device build."""

    parameters: int  # distinct parameters (a tied head counted once)
    layers: int
    hidden: int
    heads: int
    kv_heads: int
    head_dim: int
    ffn: int
    vocab: int
    largest_layer: int  # parameters of one decoder layer
    tied: bool  # input and output embeddings share one tensor
    lora_fan: dict[str, tuple[int, int]] = field(default_factory=dict)  # linear name -> (in, out) in one layer

    @classmethod
    def of(cls, hf_config: Mapping[str, Any]) -> "ModelShape":
        """Build the model of ``hf_config`` (a config.json's dict) on the meta device and count."""
        import torch
        from transformers import AutoConfig, AutoModelForCausalLM

        values = dict(hf_config)
        config = AutoConfig.for_model(values.pop("model_type"), **values)
        with torch.device("meta"):
            model = AutoModelForCausalLM.from_config(config)
        layer = model.model.layers[0]
        fan = {name.rsplit(".", 1)[-1]: (m.in_features, m.out_features)
               for name, m in layer.named_modules() if isinstance(m, torch.nn.Linear)}
        head_dim = getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads
        return cls(parameters=sum(p.numel() for p in model.parameters()), layers=config.num_hidden_layers,
                   hidden=config.hidden_size, heads=config.num_attention_heads,
                   kv_heads=getattr(config, "num_key_value_heads", None) or config.num_attention_heads,
                   head_dim=head_dim, ffn=config.intermediate_size, vocab=config.vocab_size,
                   largest_layer=sum(p.numel() for p in layer.parameters()),
                   tied=bool(getattr(config, "tie_word_embeddings", False)), lora_fan=fan)


@dataclass
class Device:
    name: str  # "cpu" or "cuda"
    capacity: int  # bytes the run may use on it
    words: str


@dataclass
class MemoryPlan:
    """Bytes per part on the busiest device; ``table()`` shows them."""

    parts: dict[str, int]
    reasons: dict[str, str]
    device: Device
    devices: int

    @property
    def total(self) -> int:
        return sum(self.parts.values())

    @property
    def fits(self) -> bool:
        return self.total <= self.device.capacity

    def biggest(self, n: int = 3) -> list[str]:
        return sorted(self.parts, key=self.parts.get, reverse=True)[:n]

    def table(self) -> str:
        rows = [f"memory plan per device ({self.devices} device(s), {self.device.words}):"]
        for name, size in self.parts.items():
            rows.append(f"  {name:<18} {bytes_text(size):>10}  {self.reasons.get(name, '')}")
        rows.append(f"  {'total':<18} {bytes_text(self.total):>10}  of {bytes_text(self.device.capacity)} "
                    f"{'available' if self.device.name == 'cpu' else 'on the device'}"
                    + ("" if self.fits else "  DOES NOT FIT"))
        return "\n".join(rows)

    def __repr__(self) -> str:
        return self.table()

    def _repr_html_(self) -> str:
        import html

        return f"<pre style='font-size:12px'>{html.escape(self.table())}</pre>"  # the table's columns stay aligned

    def refuse_if_over(self, config: RunConfig) -> None:
        """Raise :class:`MemoryPlanError` with the table, the biggest parts and the switches that would help
        when the plan does not fit (``RLKIT_SKIP_MEMORY_PLAN=1`` starts it anyway)."""
        if self.fits or os.environ.get(SKIP_ENV) == "1":
            return
        raise MemoryPlanError([
            f"policy.model_name={config.policy.model_name!r}: this config needs {bytes_text(self.total)} per "
            f"device and {self.device.words} has {bytes_text(self.device.capacity)}; the biggest parts are "
            f"{', '.join(f'{p} ({bytes_text(self.parts[p])})' for p in self.biggest())}. What would help: "
            f"{'; '.join(switches(config, self))}. (Set {SKIP_ENV}=1 to start anyway.)\n{self.table()}"])


def switches(config: RunConfig, plan: MemoryPlan) -> list[str]:
    """The settings that shrink the biggest parts, in words."""
    p, out = config.policy, []
    trained = plan.parts.get("gradients", 0) + plan.parts.get("optimizer state", 0)
    if not p.lora_cfg.enabled and trained:
        out.append(f"adapters (policy.lora_cfg.enabled=true: gradients and optimizer state, {bytes_text(trained)}, "
                   "shrink to the adapters')")
    if plan.parts.get("activations", 0) > 0.1 * plan.total and not _recompute(config):
        out.append("recompute (policy.megatron_cfg.recompute_granularity=full recompute_method=uniform "
                   "recompute_num_layers=1, or policy.dtensor_cfg.activation_checkpointing=true)")
    if p.precision == "float32" and p.generation.vllm_cfg.precision == "float32":
        out.append("policy.precision=bfloat16 and policy.generation.vllm_cfg.precision=bfloat16 (bf16 compute, "
                   "a bf16 engine copy)")
    if not p.pure_bf16 and p.backend_section.trains_in_bf16 and trained:
        out.append("pure bf16 (policy.precision=bfloat16 policy.optimizer.main_params_dtype=bfloat16: weights, "
                   "gradients and AdamW moments in bf16, no fp32 masters; loses updates below bf16's resolution)")
    out += p.backend_section.memory_switches()
    out.append(f"a smaller policy.train_micro_batch_size (now {p.train_micro_batch_size}) or "
               f"policy.max_total_sequence_length (now {p.max_total_sequence_length})")
    return out


def _recompute(config: RunConfig) -> bool:
    return config.policy.backend_section.recompute() is not None


def this_device(config: RunConfig) -> Device:
    """The device the run would use: CUDA device 0's memory, else the machine's available memory."""
    import torch

    if torch.cuda.is_available():
        free, total = torch.cuda.mem_get_info(0)
        return Device("cuda", total, f"{torch.cuda.get_device_name(0)} ({bytes_text(total)})")
    import psutil

    available = psutil.virtual_memory().available
    return Device("cpu", available, f"this machine's CPU memory ({bytes_text(available)} available now)")


def needs_reference(config: RunConfig) -> bool:
    """The rule the session applies to the loss the config builds (``builders.needs_reference(build_loss(config))``)."""
    from rlkit.algorithms import RLLoss

    return RLLoss(config.loss_fn, kl_in_reward=config.grpo.reward_kl_coef > 0).needs_reference


def plan_memory(config: RunConfig, hf_config: Optional[Mapping[str, Any]] = None,
                device: Optional[Device] = None) -> MemoryPlan:
    """The plan of ``config`` (its model folder's ``config.json``, or ``hf_config``) on ``device`` (default: this
    machine's, :func:`this_device`)."""
    if hf_config is None:
        from rlkit.models import read_hf_config

        hf_config = read_hf_config(config.policy.model_name, check_weights=False)
    shape = ModelShape.of(hf_config)
    device = device or this_device(config)
    p, backend = config.policy, config.policy.backend_section
    n = p.num_workers
    tp, shard, dp = backend.tensor_parallel_size(), backend.weight_shards(n), backend.data_parallel_size(n)
    layers_here = backend.layers_per_rank(shape.layers)
    item = 2 if p.pure_bf16 else 4  # bytes of a weight the optimizer updates (and of its gradient and moments)
    weights = shape.parameters * item // shard
    lora = p.lora_cfg
    adapters = 0
    if lora.enabled:
        names = set(lora.hf_targets())
        names |= {module for linear, module in CHECKPOINT_FUSED_MODULES.items()  # Phi-3's fused modules
                  if set(LORA_FUSED_MODULES[linear]) <= names}
        per_layer = sum(lora.dim * (i + o) for name, (i, o) in shape.lora_fan.items() if name in names)
        if lora.fused_adapters:  # one A per fused linear, not one per projection
            per_layer -= sum(lora.dim * shape.lora_fan[parts[0]][0] * (len(parts) - 1)
                             for parts in LORA_FUSED_MODULES.values() if set(parts) <= names & set(shape.lora_fan))
        adapters = per_layer * shape.layers * item // shard
    trained = adapters if lora.enabled else weights
    bf16 = p.precision == "bfloat16"
    parts = {"weights": weights, "bf16 twin": 0, "gradients": trained, "optimizer state": 2 * trained,
             "reference": weights if needs_reference(config) and not lora.enabled else 0, "adapters": adapters}
    base_once = bf16 and lora.enabled and backend.keeps_bf16_twin and not p.pure_bf16  # base held once, in bf16
    if base_once:
        parts["weights"] = weights // 2
    elif bf16 and not p.pure_bf16:
        parts["bf16 twin"] = weights // 2 if backend.keeps_bf16_twin else shape.largest_layer * 2
    rows = p.train_global_batch_size or config.grpo.num_prompts_per_step * config.grpo.num_generations_per_prompt
    micro = min(p.train_micro_batch_size, max(1, -(-rows // dp)))
    parts["activations"] = activation_bytes(shape, config, micro, layers_here, tp, 2 if bf16 else 4, device)
    t = p.max_total_sequence_length
    logprob_rows = min(p.logprob_batch_size, max(1, -(-rows // dp)))
    logits = max(micro, logprob_rows) * t * (shape.vocab // tp) * 4  # the fp32 logits of the larger pass
    chunk = backend.fused_head_chunk()
    fused_head = chunk is not None and logits > chunk
    if fused_head:  # rlkit.policy.megatron.head: a chunk's logits, softmax and gradient, and the head's gradient
        head_gradient = 0 if lora.enabled else shape.vocab // tp * shape.hidden * (2 if bf16 else 4)
        parts["logits"] = 3 * chunk + head_gradient
    else:
        parts["logits"] = max(4 * micro, 2 * logprob_rows) * t * (shape.vocab // tp) * 4
    parts["optimizer step"] = trained  # AdamW's foreach temporaries: one fp32 copy of what trains, at the step
    history = config.history
    snapshots = history.snapshots if lora.enabled or history.full_weight_snapshots else 0
    parts["weight snapshots"] = snapshots * trained  # rlkit.run.history: the states replay starts from
    dtype = "bf16" if p.pure_bf16 else "fp32"
    reasons = {"weights": f"{count_text(shape.parameters)} parameters x "
                          + ("2 B (frozen base, bf16, shared with the compute copy)" if base_once else
                             "2 B (pure bf16)" if p.pure_bf16 else "4 B (fp32 masters)")
                          + (f" / {shard}" if shard > 1 else ""),
               "bf16 twin": ("(the frozen base is the compute copy)" if base_once else "(pure bf16: none)"
                             if p.pure_bf16 else "bf16 compute copy") if bf16 else "(policy.precision=float32)",
               "gradients": f"{dtype}, of the adapters" if lora.enabled else f"{dtype}, of every weight",
               "optimizer state": f"AdamW: 2 {dtype} moments",
               "reference": "a copy of the weights: the loss reads a reference" if parts["reference"] else
                            ("none: the base with adapters off" if lora.enabled else "none: no KL penalty"),
               "adapters": f"LoRA rank {lora.dim}, {dtype}" if lora.enabled else "(no adapters)",
               "activations": f"micro batch {micro} x {t} tokens, {layers_here} layers"
                              + (", recomputed" if _recompute(config) else ""),
               "logits": ("fused head: fp32 chunks of tokens" + ("" if lora.enabled else ", the head's gradient")
                          if fused_head else
                          f"fp32 [{max(micro, logprob_rows)}, {t}, {shape.vocab // tp}]: logits, scaled, log-softmax, gradient"),
               "optimizer step": f"AdamW's temporaries (one {dtype} copy of what trains)",
               "weight snapshots": (f"history.snapshots={snapshots} copies of what trains, for replay" if snapshots else
                                    "(none: history.full_weight_snapshots=false, adapters off)")}
    engine_weights, kv = _engine_bytes(config, hf_config, shape, device)
    engine = p.generation.engine
    reasons["engine weights"] = ("none: it samples from the policy's own weights" if engine.on_policy_weights
                                 else f"{engine.name} copy in {engine.precision(p.generation.vllm_cfg)}")
    handoff = engine_handoff(p.generation, config.generation_colocated, device.name == "cpu", device.name == "cuda")
    if engine_weights and handoff == "release_weights":  # the engine's side of the hand-off, as it decides it
        # only while training: the step's transients and the gradient buffers (freed at each refit)
        transients = parts["activations"] + parts["logits"] + parts["optimizer step"] + parts["gradients"]
        base_released = lora.releases_base and backend.releases_frozen_base
        if base_released:  # the frozen base is out while the engine holds its copy, and back while it is released
            transients += parts["weights"]
        engine_weights = max(0, engine_weights - transients)
        reasons["engine weights"] += (", released while training: what it holds beyond the step's gradients and transients"
                                      + (" and the frozen base, released while it generates" if base_released else ""))
    parts["engine weights"], parts["KV cache"] = engine_weights, kv
    kv_words = f"kv_cache_space_gib={p.generation.vllm_cfg.kv_cache_space_gib}" if device.name == "cpu" \
        else "gpu_memory_utilization less its weights"
    reasons["KV cache"] = kv_words if engine.reads_vllm_cfg else f"({engine.words}: per call)"
    parts["critic"], reasons["critic"] = _critic_bytes(config, shape, device)
    parts["teacher"], reasons["teacher"] = _teacher_bytes(config, shape, item, shard)
    parts["runtime"] = RUNTIME_CPU_BYTES if device.name == "cpu" else RUNTIME_CUDA_BYTES
    reasons["runtime"] = "libraries and engines' own state (measured)" if device.name == "cpu" else "CUDA context"
    return MemoryPlan(parts, reasons, device, n)


def value_model_shard(config: RunConfig, on_policy_backend: bool) -> int:
    """The ways a value model is split: the policy's tensor parallelism when it runs on the policy's backend
    (``critic.on_policy_backend``) beside an in-process policy, else whole."""
    p = config.policy
    return p.backend_section.tensor_parallel_size() if on_policy_backend and p.num_workers == 1 else 1


def _critic_bytes(config: RunConfig, shape: ModelShape, device: Device) -> tuple[int, str]:
    """PPO's critic (``critic.enabled``): :func:`rlkit.memory.value_models.value_model_bytes` of its parameters, and
    its activations at ``critic.micro_batch_size`` rows (the policy's counting; critic.model_name's folder is
    counted at the policy's shape)."""
    critic = config.critic
    if not critic.enabled:
        return 0, "(no critic: critic.enabled=false)"
    shard = value_model_shard(config, critic.on_policy_backend)
    n = value_model_parameters(shape.parameters, shape.vocab, shape.hidden, shape.tied, bias=True)
    activations = activation_bytes(shape, config, critic.micro_batch_size, shape.layers, shard, 4, device)
    parts = value_model_bytes(n, shard, activations)
    return parts.total, (f"{count_text(n)} parameters x 20 B (fp32 weights, gradients, AdamW's moments and "
                         f"temporaries){f' / {shard}' if shard > 1 else ''} + activations of "
                         f"{critic.micro_batch_size} rows")


def _teacher_bytes(config: RunConfig, student: ModelShape, item: int, shard: int) -> tuple[int, str]:
    """The distillation teacher's weights (``distillation.enabled``, :mod:`rlkit.policy.teacher`): its parameters
    in the policy's weight dtype, sharded as the policy's, with the bf16 compute copy where the backend keeps one;
    no gradients or optimizer state (frozen), and its forward's logits never coexist with the train step's (counted
    there). Its folder's ``config.json`` gives its shape; a folder not made yet is counted at the student's."""
    d = config.distillation
    if not d.enabled:
        return 0, "(no teacher: distillation.enabled=false)"
    from rlkit.models import read_hf_config

    try:
        shape, whose = ModelShape.of(read_hf_config(d.teacher_model_name, check_weights=False)), ""
    except Exception:  # (the run itself refuses a missing teacher, with the fix, when it starts)
        shape, whose = student, " (its folder not made yet: at the student's shape)"
    p, backend = config.policy, config.policy.backend_section
    twin = 2 if p.precision == "bfloat16" and not p.pure_bf16 and backend.keeps_bf16_twin else 0
    return (shape.parameters * (item + twin) // shard,
            f"{count_text(shape.parameters)} parameters x {item + twin} B, frozen{whose}")


def activation_bytes(shape: ModelShape, config: RunConfig, micro: int, layers: int, tp: int, item: int,
                      device: Device) -> int:
    """Activations kept for backward by ``layers`` dense decoder layers for ``micro`` rows of the configured length:
    per token of a layer the norms' inputs and outputs (4h), q/k/v after projection, norm and RoPE (3 (q + 2kv)), the
    attention output (q) and the projections' outputs (2h), the MLP's gate, up, activation and product (4 ffn);
    per row and head the T x T scores and probabilities (2 T^2: Megatron's unfused attention on the CPU; dropped by
    selective recompute; SDPA's fused kernels keep none). Recompute keeps each layer's input (h per token) plus one layer's worth."""
    h, q, kv, f = shape.hidden, shape.heads * shape.head_dim // tp, shape.kv_heads * shape.head_dim // tp, shape.ffn // tp
    t = config.policy.max_total_sequence_length
    per_token = 6 * h + 3 * (q + 2 * kv) + q + 4 * f
    backend = config.policy.backend_section
    unfused = backend.unfused_attention_on_cpu and device.name == "cpu"  # (SDPA's fused kernels keep no T x T matrix)
    attention = 2 * (shape.heads // tp) * t * t if unfused else 0
    selective = backend.recompute() == "selective"
    layer = micro * (t * per_token + (0 if selective else attention)) * item
    if _recompute(config) and not selective:
        return micro * t * h * item * layers + layer
    return layer * layers


def auto_kv_cache_bytes(hf_config: Mapping[str, Any], precision: str, max_model_len: int, sequences: int) -> int:
    """A CPU engine's KV cache that holds ``sequences`` sequences of ``max_model_len`` tokens at once: per token
    the keys and values of every layer (2 x layers x kv_heads x head_dim elements) in the engine's precision (fp32:
    4 bytes; bf16, and fp8 whose cache stays bf16: 2), each sequence rounded up to whole blocks. More sequences
    than that are queued by vLLM's scheduler, not refused."""
    heads = hf_config.get("num_key_value_heads") or hf_config["num_attention_heads"]
    item = 4 if precision == "float32" else 2
    per_token = 2 * hf_config["num_hidden_layers"] * heads * head_dim_of(hf_config) * item
    return sequences * -(-max_model_len // CPU_KV_BLOCK_TOKENS) * CPU_KV_BLOCK_TOKENS * per_token


def kv_cache_bytes(config: RunConfig, hf_config: Mapping[str, Any]) -> int:
    """The CPU engine's KV cache for ``config``: ``vllm_cfg.kv_cache_space_gib`` GiB, or with ``"auto"`` what one
    rollout batch (``grpo.num_prompts_per_step x grpo.num_generations_per_prompt`` sequences) needs at the engine's
    full length (:func:`auto_kv_cache_bytes`). Why not a fixed default: the cache is allocated and zeroed at start,
    so it is resident memory all run long; a larger batch, such as an eval of 500 prompts, runs in waves of what
    fits."""
    vllm_cfg = config.policy.generation.vllm_cfg
    if vllm_cfg.kv_cache_space_gib != "auto":
        return int(vllm_cfg.kv_cache_space_gib * GIB)
    sequences = config.grpo.num_prompts_per_step * config.grpo.num_generations_per_prompt
    return auto_kv_cache_bytes(hf_config, vllm_cfg.precision, config.policy.max_model_len, sequences)


def _engine_bytes(config: RunConfig, hf_config: Mapping[str, Any], shape: ModelShape,
                  device: Device) -> tuple[int, int]:
    """The generator's weights and KV cache on this device (a colocated engine; a separate one lives elsewhere)."""
    g = config.policy.generation
    if not config.generation_colocated or g.engine.on_policy_weights:  # elsewhere, or the policy's own weights
        return 0, 0
    per_param = BYTES_PER_PARAMETER[g.engine.precision(g.vllm_cfg)]
    weights = shape.parameters * per_param
    if not g.engine.reads_vllm_cfg:  # (no cache held between calls)
        return weights, 0
    if device.name == "cpu":  # copies of the output head's table, tied or not (GenerationEngine.cpu_head_copies)
        head_copies = g.engine.cpu_head_copies * shape.vocab * shape.hidden * per_param
        return weights + head_copies, kv_cache_bytes(config, hf_config)
    return weights, max(0, int(g.vllm_cfg.gpu_memory_utilization * device.capacity) - weights)


def refuse_unless_fits(config: RunConfig) -> Optional[MemoryPlan]:
    """Before a session loads anything: the plan of ``config``, refused (:class:`MemoryPlanError`) when it does not
    fit this machine's device. None when the model folder does not exist yet (a preset made at start: tiny)."""
    from pathlib import Path

    if not (Path(config.policy.model_name) / "config.json").is_file():
        return None
    plan = plan_memory(config)
    plan.refuse_if_over(config)
    return plan
