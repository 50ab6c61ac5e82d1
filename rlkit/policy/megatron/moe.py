"""Mixture-of-Experts for the Megatron policy: Mixtral, Qwen2-MoE, Qwen3-MoE, DeepSeek-V3 and GPT-OSS HF models <->
Megatron-Core MoE layers (GPT-OSS's stacked, biased experts and its router bias: :mod:`.gpt_oss`).

Each block is the dense block (attention, with Qwen3's q/k norms for Qwen3-MoE) with the MLP replaced by a
router and SwiGLU experts, so everything but the MLP reuses :mod:`rlkit.policy.megatron.convert`. Every knob
is a native Megatron-Core option:

* routing: Mixtral and Qwen3-MoE (``norm_topk_prob: true``) take the softmax over all experts, keep the top k
  and renormalise them, which is Megatron's default router (top k of the logits, softmax over those k);
  Qwen2-MoE (``norm_topk_prob: false``) keeps the top k of the full softmax unrenormalised, which is
  ``moe_router_pre_softmax``;
* Qwen2-MoE's shared expert, added to every token's routed output and scaled by a sigmoid gate, is
  ``moe_shared_expert_intermediate_size`` with ``moe_shared_expert_gate``;
* DeepSeek-V3 (attention: :mod:`.mla`): its first ``first_k_dense_replace`` layers dense (``moe_layer_freq`` as a
  list, their width ``ffn_hidden_size``), ungated shared experts, sigmoid scores (``moe_router_score_function``) with the
  score-correction bias for choosing only (``moe_router_enable_expert_bias``, a router buffer loaded and exported as
  ``gate.e_score_correction_bias`` and kept fixed: ``moe_router_bias_update_rate=0``), groups chosen first
  (``moe_router_num_groups`` / ``moe_router_group_topk``), the kept scores renormalised and scaled by
  ``routed_scaling_factor`` (``moe_router_topk_scaling_factor``).

Verified against transformers in fp32 (~1e-7).

=============================================  ================================================================
Megatron (local spec, SequentialMLP experts)   HF checkpoint names (Mixtral: ``block_sparse_moe.``, w1/w3/w2;
                                               Qwen: ``mlp.``, gate_proj/up_proj/down_proj)
=============================================  ================================================================
decoder.layers.i.mlp.router.weight  [E, H]     ...gate.weight
...mlp.experts.local_experts.e.linear_fc1      [experts.e.(w1|gate_proj); experts.e.(w3|up_proj)]
...mlp.experts.local_experts.e.linear_fc2      experts.e.(w2|down_proj)
...mlp.shared_experts.linear_fc1 / fc2         mlp.shared_expert.[gate_proj; up_proj] / down_proj (Qwen2-MoE)
...mlp.shared_experts.gate_weight  [1, H]      mlp.shared_expert_gate.weight (Qwen2-MoE)
everything else                                as the dense model (see convert.py)
=============================================  ================================================================

Router settings for RL (``policy.megatron_cfg``, NeMo-RL's names): ``moe_router_dtype=fp64`` (routing
decisions that do not flip between the scoring and the training pass), ``moe_router_load_balancing_type=none``
with ``moe_aux_loss_coeff=0`` (no auxiliary loss pulling against the RL objective), ``freeze_moe_router``
(the router takes no gradient steps).

Expert parallelism (``expert_model_parallel_size``) splits the experts over ranks (see
:class:`MegatronMoEAdapter`); the all-gather token dispatcher brings every token to the rank holding its
experts. Refused with the reason: Qwen-MoE models with dense layers between the MoE ones
(``decoder_sparse_step`` > 1 or ``mlp_only_layers``). Deliberate simplification: experts run one after
another (no grouped GEMM). One stand-in: megatron-core 0.16.1 without Transformer Engine names an undefined
``te_general_gemm`` in the router's linear, so :func:`apply_moe_fallbacks` defines it as None, which selects
the plain ``torch.mm`` path the code already has.
"""

from __future__ import annotations

import dataclasses
import re
from typing import Callable, Iterator, Mapping

import torch
import torch.distributed as dist
from megatron.core import parallel_state as ps
from torch import Tensor

from rlkit.config.components import MegatronConfig
from rlkit.errors import ModelError
from rlkit.models.families import BY_NAME
from rlkit.models.folder import num_experts_of
from rlkit.policy.megatron import convert, gpt_oss
from rlkit.policy.architecture import Architecture
from rlkit.policy.megatron.build import build_gpt_model, transformer_config
from rlkit.policy.megatron.policy import MegatronAdapter
from rlkit.weights import HFGroup


def is_moe(hf_config: Mapping) -> bool:
    """True for a Mixture-of-Experts HF config (Mixtral, Qwen2-MoE, Qwen3-MoE)."""
    return num_experts_of(dict(hf_config)) > 0


@dataclasses.dataclass(frozen=True)
class MoEArchitecture(Architecture):
    """The dense facts plus the expert layout (``ffn_hidden_size`` is one expert's)."""

    num_experts: int = 0
    top_k: int = 2
    norm_topk_prob: bool = True  # renormalise the kept experts' probabilities (False: Qwen2-MoE's default)
    shared_expert_size: int = 0  # Qwen2-MoE: the width of the shared expert (gated by a sigmoid); 0: none
    shared_expert_gated: bool = True  # Qwen2-MoE's sigmoid gate on the shared expert (DeepSeek-V3's has none)
    first_dense_layers: int = 0  # DeepSeek-V3's first_k_dense_replace: layers 0..k-1 have a dense MLP
    dense_ffn_hidden_size: int = 0  # their MLP's width (intermediate_size)
    score_function: str = "softmax"  # DeepSeek-V3: "sigmoid", each expert's score on its own
    expert_bias: bool = False  # DeepSeek-V3: e_score_correction_bias, added to the scores for choosing only
    num_groups: int | None = None  # DeepSeek-V3's n_group: the experts in groups, topk_group of them chosen first
    group_topk: int | None = None
    routed_scaling_factor: float | None = None  # DeepSeek-V3: the kept experts' weights times this

    @property
    def hf_prefix(self) -> str:
        """Where a layer's MLP lives in the HF checkpoint."""
        return BY_NAME[self.family].expert_prefix

    @property
    def hf_expert_names(self) -> tuple[str, str, str]:
        """HF names of an expert's gate, up and down projections."""
        return BY_NAME[self.family].expert_names

    @classmethod
    def from_hf_config(cls, cfg: dict) -> "MoEArchitecture":
        dense = dataclasses.asdict(Architecture.from_hf_config(cfg))
        if BY_NAME[dense["family"]].mla:
            return cls._deepseek_v3(dense, cfg)
        if dense["family"] == "mixtral" or BY_NAME[dense["family"]].gpt_oss:  # GPT-OSS: top-k logits, softmax over k
            return cls(**dense, num_experts=num_experts_of(cfg), top_k=cfg["num_experts_per_tok"])
        if cfg.get("decoder_sparse_step", 1) != 1 or cfg.get("mlp_only_layers"):
            raise ModelError(f"a {dense['family']} model with dense layers between its MoE layers (decoder_sparse_step="
                             f"{cfg.get('decoder_sparse_step')}, mlp_only_layers={cfg.get('mlp_only_layers')}) is not "
                             "supported; rlkit maps models whose every layer is an MoE layer")
        dense["ffn_hidden_size"] = cfg["moe_intermediate_size"]
        return cls(**dense, num_experts=num_experts_of(cfg), top_k=cfg["num_experts_per_tok"],
                   norm_topk_prob=bool(cfg.get("norm_topk_prob", True)),
                   shared_expert_size=cfg.get("shared_expert_intermediate_size") or 0)


    @classmethod
    def _deepseek_v3(cls, dense: dict, cfg: dict) -> "MoEArchitecture":
        """DeepSeek-V3's routing as Megatron's: sigmoid scores, the score-correction bias for choosing, groups chosen
        by the sum of their top-2 scores (Megatron's sum of their top ``k / topk_group``: refused where that is not
        2), the kept scores renormalised (Megatron does for sigmoid; ``norm_topk_prob: false`` refused) and scaled."""
        top_k, groups, group_topk = cfg["num_experts_per_tok"], cfg.get("n_group") or 1, cfg.get("topk_group") or 1
        if groups > 1 and top_k // group_topk != 2:
            raise ModelError(f"DeepSeek-V3 with num_experts_per_tok={top_k}, topk_group={group_topk}: a group's score "
                             "is the sum of its top 2 experts' in transformers and of its top num_experts_per_tok / "
                             "topk_group in Megatron; rlkit maps configs where that is 2 (DeepSeek-V3's 8 / 4)")
        if not cfg.get("norm_topk_prob", True):
            raise ModelError("DeepSeek-V3 with norm_topk_prob: false is not supported: Megatron renormalises the kept "
                             "sigmoid scores (DeepSeek-V3's own setting)")
        layers = cfg["num_hidden_layers"]
        first_dense = min(cfg.get("first_k_dense_replace") or 0, layers)
        if first_dense == layers:
            raise ModelError(f"DeepSeek-V3 with first_k_dense_replace={cfg['first_k_dense_replace']} >= its {layers} "
                             "layers has no MoE layer; rlkit maps it as an MoE model")
        dense = dict(dense, ffn_hidden_size=cfg["moe_intermediate_size"])
        return cls(**dense, num_experts=num_experts_of(cfg), top_k=top_k, norm_topk_prob=True,
                   shared_expert_size=(cfg.get("n_shared_experts") or 0) * cfg["moe_intermediate_size"],
                   shared_expert_gated=False, first_dense_layers=first_dense,
                   dense_ffn_hidden_size=cfg["intermediate_size"], score_function="sigmoid", expert_bias=True,
                   num_groups=groups if groups > 1 else None, group_topk=group_topk if groups > 1 else None,
                   routed_scaling_factor=float(cfg.get("routed_scaling_factor") or 1.0))

    def is_moe_layer(self, i: int) -> bool:
        return i >= self.first_dense_layers


def apply_moe_fallbacks() -> None:
    """Define the Transformer Engine GEMM the MoE router tests for, when TE is absent (see module docstring)."""
    from megatron.core.transformer.moe import moe_utils

    if not getattr(moe_utils, "HAVE_TE", True) and not hasattr(moe_utils, "te_general_gemm"):
        moe_utils.te_general_gemm = None


def build_moe_gpt_model(arch: MoEArchitecture, tensor_parallel_size: int, pipeline_parallel_size: int,
                        mc: MegatronConfig, initialize: bool = True):
    """This pipeline stage's ``GPTModel`` with MoE MLPs in the layout of ``arch``, router settings from ``mc``;
    ``initialize=False`` for a model whose every weight is read next (:func:`.build.transformer_config`)."""
    apply_moe_fallbacks()
    config = dataclasses.replace(
        transformer_config(arch, tensor_parallel_size, mc.sequence_parallel, pipeline_parallel_size,
                           recompute=mc.recompute_settings(), initialize=initialize),
        num_moe_experts=arch.num_experts,
        moe_router_topk=arch.top_k,
        moe_ffn_hidden_size=arch.ffn_hidden_size,
        moe_router_dtype=mc.moe_router_dtype,
        moe_router_load_balancing_type=mc.moe_router_load_balancing_type,
        moe_aux_loss_coeff=mc.moe_aux_loss_coeff,
        moe_token_dispatcher_type="allgather",
        moe_router_pre_softmax=not arch.norm_topk_prob,
        moe_shared_expert_intermediate_size=arch.shared_expert_size or None,
        moe_shared_expert_gate=arch.shared_expert_size > 0 and arch.shared_expert_gated,
        **_deepseek_settings(arch),
        moe_grouped_gemm=False,
        expert_model_parallel_size=mc.expert_model_parallel_size,
        expert_tensor_parallel_size=mc.expert_tensor_parallel_size,
    )
    model = build_gpt_model(arch, config, arch.num_experts)
    if mc.freeze_moe_router:
        for name, param in model.named_parameters():
            if name.endswith(("mlp.router.weight", "mlp.router.bias")):
                param.requires_grad_(False)
    return model


def _deepseek_settings(arch: MoEArchitecture) -> dict:
    """DeepSeek-V3's layer pattern and routing as Megatron options (none for the other families). The score-correction
    bias is loaded and kept: RL leaves it as the checkpoint has it (``moe_router_bias_update_rate=0``)."""
    if arch.score_function == "softmax" and not arch.first_dense_layers:
        return {}
    return dict(moe_layer_freq=[int(arch.is_moe_layer(i)) for i in range(arch.num_layers)],
                ffn_hidden_size=arch.dense_ffn_hidden_size or arch.ffn_hidden_size,
                moe_router_score_function=arch.score_function, moe_router_enable_expert_bias=arch.expert_bias,
                moe_router_bias_update_rate=0.0, moe_router_num_groups=arch.num_groups,
                moe_router_group_topk=arch.group_topk, moe_router_topk_scaling_factor=arch.routed_scaling_factor)


# ---- conversion (full tensors) ---------------------------------------------------------------------
def hf_layer_to_megatron(hf: Mapping[str, Tensor], i: int, arch: MoEArchitecture) -> dict[str, Tensor]:
    if arch.attention_sinks:  # GPT-OSS: stacked biased experts, router bias, sinks
        return gpt_oss.layer_to_megatron(hf, i, arch)
    if not arch.is_moe_layer(i):  # DeepSeek-V3's first layers
        return convert.hf_layer_to_megatron(hf, i, arch)
    h, m = f"model.layers.{i}.{arch.hf_prefix}", f"decoder.layers.{i}.mlp."
    out = convert.attention_to_megatron(hf, i, arch)
    out[m + "router.weight"] = hf[h + "gate.weight"]
    if arch.expert_bias:
        out[m + "router.expert_bias"] = hf[h + "gate.e_score_correction_bias"]
    for e in range(arch.num_experts):
        out.update(convert.gated_mlp_to_megatron(hf, f"{h}experts.{e}.", arch.hf_expert_names, f"{m}experts.local_experts.{e}."))
    if arch.shared_expert_size:
        shared = h + BY_NAME[arch.family].shared_expert
        out.update(convert.gated_mlp_to_megatron(hf, shared, arch.hf_expert_names, m + "shared_experts."))
        if arch.shared_expert_gated:
            out[m + "shared_experts.gate_weight"] = hf[h + "shared_expert_gate.weight"]
    return out


def layer_param_names(i: int, arch: MoEArchitecture) -> list[str]:
    if arch.attention_sinks:
        return gpt_oss.layer_param_names(i, arch)
    if not arch.is_moe_layer(i):
        return convert.layer_param_names(i, arch)
    m = f"decoder.layers.{i}.mlp."
    names = convert.attention_param_names(i, arch) + [m + "router.weight"]
    names += [m + "router.expert_bias"] if arch.expert_bias else []
    for e in range(arch.num_experts):
        names += [f"{m}experts.local_experts.{e}.linear_fc1.weight", f"{m}experts.local_experts.{e}.linear_fc2.weight"]
    if arch.shared_expert_size:
        names += [m + "shared_experts.linear_fc1.weight", m + "shared_experts.linear_fc2.weight"]
        names += [m + "shared_experts.gate_weight"] if arch.shared_expert_gated else []
    return names


def megatron_layer_to_hf(mc: Mapping[str, Tensor], i: int, arch: MoEArchitecture) -> HFGroup:
    """HF tensors of decoder layer ``i`` (attention, router, every expert, the shared expert: one group)."""
    if arch.attention_sinks:
        return gpt_oss.layer_to_hf(mc, i, arch)
    if not arch.is_moe_layer(i):
        return convert.megatron_layer_to_hf(mc, i, arch)
    h, m = f"model.layers.{i}.{arch.hf_prefix}", f"decoder.layers.{i}.mlp."
    out = convert.attention_to_hf(mc, i, arch) + [(h + "gate.weight", mc[m + "router.weight"])]
    if arch.expert_bias:
        out.append((h + "gate.e_score_correction_bias", mc[m + "router.expert_bias"]))
    for e in range(arch.num_experts):
        out += convert.gated_mlp_to_hf(mc, f"{m}experts.local_experts.{e}.", f"{h}experts.{e}.", arch.hf_expert_names)
    if arch.shared_expert_size:
        shared = h + BY_NAME[arch.family].shared_expert
        out += convert.gated_mlp_to_hf(mc, m + "shared_experts.", shared, arch.hf_expert_names)
        if arch.shared_expert_gated:
            out.append((h + "shared_expert_gate.weight", mc[m + "shared_experts.gate_weight"]))
    return out


# ---- the policy --------------------------------------------------------------------------------------
class MegatronMoEAdapter(MegatronAdapter):
    """:class:`MegatronAdapter` on a Mixture-of-Experts model; only the model and its weight mapping differ.

    With expert parallelism (``expert_model_parallel_size`` = EP) expert-parallel rank r holds the experts
    ``r*E/EP .. (r+1)*E/EP - 1`` as Megatron's local experts ``0 .. E/EP - 1``; loading keeps this rank's
    experts and export gathers each layer's experts from the expert-parallel group.
    """

    architecture = MoEArchitecture

    def _build_model(self):
        if self.arch.kv_lora_rank and self.tp_size > 1:
            raise ModelError(f"DeepSeek-V3's latent attention under tensor parallelism (TP={self.tp_size}) is not "
                             "supported: megatron-core 0.16.1's MLA on the local layer spec (column-parallel down "
                             "projections) leaves the shared RoPE key's gradient partial on each rank (measured: "
                             "kv_a_proj_with_mqa's RoPE rows 2e-3 off one process after a step, logprobs equal). "
                             "Fix: policy.megatron_cfg.tensor_model_parallel_size=1 (expert parallelism works)")
        gpt_oss.check_layout(self.arch, self.tp_size)
        self.ep_rank, self.ep_size = ps.get_expert_model_parallel_rank(), ps.get_expert_model_parallel_world_size()
        self.experts_per_rank = self.arch.num_experts // self.ep_size
        self._gathered_experts: dict[str, Tensor] = {}  # experts of the layer being exported, from other ranks
        return build_moe_gpt_model(self.arch, self.tp_size, self.pp_size, self.cfg.megatron_cfg,
                                   initialize=False)  # every weight is read from the folder next (strict)

    def _params_by_global_name(self) -> dict[str, Tensor]:
        """The parameters, and DeepSeek-V3's score-correction biases (buffers of the router, loaded and exported
        with the weights; no gradient reaches them)."""
        biases = {self._global_name(n): b for n, b in self.model.named_buffers() if n.endswith("router.expert_bias")}
        return {**super()._params_by_global_name(), **biases}

    def _global_name(self, local_name: str) -> str:
        """Layers numbered across pipeline stages, and ``...local_experts.j...`` -> the global expert index."""
        name = super()._global_name(local_name)
        match = _LOCAL_EXPERT.search(name)
        if match is None or self.ep_size == 1:
            return name
        return _with_expert(name, match, self.ep_rank * self.experts_per_rank + int(match.group(1)))

    def _hf_to_megatron_groups(self, hf: Mapping[str, Tensor], layers: list[int],
                               ends: bool = True) -> Iterator[dict[str, Tensor]]:
        return convert.hf_to_megatron_groups(hf, self.arch, hf_layer_to_megatron, layers, ends)

    def _megatron_to_hf_groups(self, full: Callable[[str], Tensor]) -> Iterator[HFGroup]:
        self._gathered_experts.clear()
        return convert.megatron_to_hf_groups(full, self.arch, layer_param_names, megatron_layer_to_hf)

    def _shard_rank_and_size(self, name: str) -> tuple[int, int]:
        """Expert weights are split over the expert-tensor-parallel group, the rest over tensor parallelism."""
        if _LOCAL_EXPERT.search(name):
            return ps.get_expert_tensor_parallel_rank(), ps.get_expert_tensor_parallel_world_size()
        return self.tp_rank, self.tp_size

    def agreed_length(self, t: int) -> int:
        """Under expert parallelism the longest over the expert-parallel group: Megatron's all-gather token
        dispatcher needs the same number of tokens from every rank of the group in each forward pass."""
        if self.ep_size == 1:
            return t
        longest = torch.tensor(t, device=self.device)
        dist.all_reduce(longest, op=dist.ReduceOp.MAX, group=ps.get_expert_model_parallel_group())
        return int(longest)

    def _stage_full_tensor(self, name: str, params: Mapping[str, Tensor]) -> Tensor:
        """Full tensor of this stage's parameter ``name``. For an expert under expert parallelism one
        all-gather over the expert-parallel group brings local expert j from every rank (experts
        ``r*E/EP + j``); the ones not asked for yet wait in ``_gathered_experts`` until the export reaches
        them (at most one layer's)."""
        match = _LOCAL_EXPERT.search(name)
        if match is None:
            return self._full_tensor(name, params)
        if name in self._gathered_experts:
            return self._gathered_experts.pop(name)
        owner, j = divmod(int(match.group(1)), self.experts_per_rank)
        mine = _with_expert(name, match, self.ep_rank * self.experts_per_rank + j)
        local = self._full_tensor(mine, params, group=ps.get_expert_tensor_parallel_group())  # whole over expert-TP
        if self.ep_size == 1:
            return local
        pieces = [torch.empty_like(local) for _ in range(self.ep_size)]
        dist.all_gather(pieces, local.contiguous(), group=ps.get_expert_model_parallel_group())
        for r, piece in enumerate(pieces):
            if r != owner:
                self._gathered_experts[_with_expert(name, match, r * self.experts_per_rank + j)] = piece
        return pieces[owner]

    def __repr__(self) -> str:
        ep = f", EP={self.ep_size}" if self.ep_size > 1 else ""
        return super().__repr__().replace("MegatronAdapter(", f"MegatronMoEAdapter({self.arch.num_experts} experts "
                                          f"top-{self.arch.top_k}{ep}, ", 1)


_LOCAL_EXPERT = re.compile(r"\.local_experts\.(\d+)\.")


def _with_expert(name: str, match: re.Match, expert: int) -> str:
    """``name`` with the expert index that ``match`` (of :data:`_LOCAL_EXPERT`) found replaced by ``expert``."""
    return f"{name[:match.start(1)]}{expert}{name[match.end(1):]}"
