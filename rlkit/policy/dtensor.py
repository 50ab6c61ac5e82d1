"""The PyTorch-native policy: a transformers causal LM sharded with FSDP2 (``fully_shard``) over a DTensor mesh.

Why a second backend: it trains transformers' own implementation of the model, with no weight conversion
(the HF names are the parameter names), and it is the baseline the Megatron backend is measured against. It
presents the same interface as :class:`rlkit.policy.megatron.policy.MegatronPolicy`, so a notebook switches
with ``policy.dtensor_cfg.enabled=true`` / ``policy.megatron_cfg.enabled=false`` and compares.

Numerics shared with the Megatron policy: logits divided by the sampling temperature, logprobs by
log-softmax and gather, the loss normalised by counts over the global batch (all-reduced over the mesh),
gradients *summed* over data-parallel ranks (FSDP's default average is switched off, because the loss is
already a global-batch value), clipping by the global norm, AdamW with the same learning-rate schedule
(:func:`rlkit.policy.optimizer_step.lr_lambda`), and the KL reference as a weight copy swapped in.

Deliberate simplifications: one data-parallel mesh dimension (no tensor or context parallelism), fp32
weights, each decoder layer one FSDP unit, the full vocabulary's log-softmax per microbatch, dense models
only (transformers 5 holds Mixtral's experts fused under names that differ from the checkpoint's).
"""

from __future__ import annotations

import re
from typing import Iterator, Mapping

import torch
import torch.distributed as dist
from torch import Tensor

from rlkit.config.components import OptimizerConfig, PolicyConfig, SchedulerConfig
from rlkit.errors import ModelError
from rlkit.policy.base import HFGroup, LossFn, TokenScores, weights_swapped_in
from rlkit.policy.megatron.build import Architecture
from rlkit.policy.megatron.parallel import ensure_process_group
from rlkit.policy.optimizer_step import MicrobatchedTraining, lr_lambda, sum_metrics_over_ranks
from rlkit.trajectories import LossCounts, Trajectories

_LAYER = re.compile(r"^model\.layers\.(\d+)\.")


def _local(t: Tensor) -> Tensor:
    """This rank's shard of a DTensor (a plain tensor is its own shard)."""
    return t.to_local() if hasattr(t, "to_local") else t


def shifted_logprobs_and_entropy(logits: Tensor, input_ids: Tensor, with_entropy: bool) -> tuple[Tensor, Tensor | None]:
    """logits [b, T, V] (position t predicts token t+1), input_ids [b, T] -> logprobs [b, T] (and entropy
    [b, T]) aligned with the token they score; position 0 holds 0."""
    logp = torch.log_softmax(logits[:, :-1].float(), dim=-1)
    token = logp.gather(-1, input_ids[:, 1:, None]).squeeze(-1)
    entropy = None
    if with_entropy:
        with torch.no_grad():
            entropy = torch.nn.functional.pad(-(logp.exp() * logp).sum(-1), (1, 0))
    return torch.nn.functional.pad(token, (1, 0)), entropy


class DTensorPolicy(MicrobatchedTraining):
    """A causal LM from an HF folder, FSDP2-sharded over all ranks (implements :class:`rlkit.policy.base.Policy`)."""

    def __init__(self, cfg: PolicyConfig, seed: int = 0, *, param_dtype: torch.dtype = torch.float32):
        from torch.distributed.device_mesh import init_device_mesh
        from torch.distributed.fsdp import FSDPModule, fully_shard
        from transformers import AutoModelForCausalLM

        self.cfg = cfg
        self.arch = Architecture.from_hf_folder(cfg.model_name)
        if self.arch.family == "mixtral":
            raise ModelError("the DTensor backend does not train Mixture-of-Experts models yet (transformers holds the "
                             "experts fused, under other names than the checkpoint's); use policy.megatron_cfg")
        ensure_process_group()
        self.dp_rank, self.dp_size = dist.get_rank(), dist.get_world_size()
        self.device = torch.device("cuda", torch.cuda.current_device()) if torch.cuda.is_available() else torch.device("cpu")
        self.mesh = init_device_mesh(self.device.type, (self.dp_size,), mesh_dim_names=("dp",))
        torch.manual_seed(seed)
        # param_dtype: the config's precision is float32; benchmarks pass bfloat16 (weights, grads, Adam state)
        model = AutoModelForCausalLM.from_pretrained(cfg.model_name, dtype=param_dtype, attn_implementation="sdpa")
        model.to(self.device)
        for layer in model.model.layers:
            fully_shard(layer, mesh=self.mesh)
        fully_shard(model, mesh=self.mesh)
        for module in model.modules():
            if isinstance(module, FSDPModule):  # each FSDP unit keeps its own reduction settings
                module.set_gradient_divide_factor(1.0)  # sum over ranks: the loss is already a global value
                module.set_force_sum_reduction_for_comms(True)  # plain SUM (gloo has no AVG / PREMUL_SUM)
        self.model = model
        self.reset_optimizer(cfg.optimizer, cfg.scheduler)
        self.temperature = cfg.generation.temperature
        self.version = 0
        self.reference_state: dict[str, Tensor] | None = None
        self.set_reference_to_current()

    def reset_optimizer(self, optimizer: OptimizerConfig, scheduler: SchedulerConfig) -> None:
        """A fresh AdamW and learning-rate schedule (e.g. between an SFT warm start and RL)."""
        self.optimizer = torch.optim.AdamW(
            self.model.parameters(), lr=optimizer.lr, betas=optimizer.betas, eps=optimizer.eps,
            weight_decay=optimizer.weight_decay,
        )
        self.scheduler = torch.optim.lr_scheduler.LambdaLR(self.optimizer, lr_lambda(scheduler))

    # ---- weights ----------------------------------------------------------------------------------
    def load_hf_state(self, hf: Mapping[str, Tensor]) -> None:
        """Load HF-named full tensors; this rank keeps its shard. Strict on names and shapes."""
        from torch.distributed.tensor import distribute_tensor

        params = dict(self.model.named_parameters())
        missing = sorted(set(params) - set(hf))
        if missing:
            raise KeyError(f"no HF weights for parameters {missing[:5]}")
        with torch.no_grad():
            for name, param in params.items():
                if tuple(hf[name].shape) != tuple(param.shape):
                    raise ValueError(f"{name}: HF weights have shape {tuple(hf[name].shape)}, model has {tuple(param.shape)}")
                full = hf[name].to(self.device, param.dtype)
                param.copy_(distribute_tensor(full, self.mesh, param.placements) if hasattr(param, "placements") else full)

    def export_hf_groups(self) -> Iterator[HFGroup]:
        """HF-named full tensors: embeddings, each decoder layer, then final norm and head. Gathering is a
        collective, so every rank must iterate in step. At one rank they may alias the live weights:
        copy them if you keep them past the next optimizer step."""
        groups: dict[str, list[str]] = {}
        for name, _ in self.model.named_parameters():
            m = _LAYER.match(name)
            key = f"layer{int(m.group(1)):06d}" if m else ("0embed" if "embed_tokens" in name else "zfinal")
            groups.setdefault(key, []).append(name)
        params = dict(self.model.named_parameters())
        for key in sorted(groups):
            yield [(name, self._full_tensor(params[name])) for name in groups[key]]

    @staticmethod
    def _full_tensor(param: Tensor) -> Tensor:
        t = param.detach()
        return t.full_tensor() if hasattr(t, "full_tensor") else t

    def hf_state_dict(self) -> dict[str, Tensor]:
        return {name: t.clone() for group in self.export_hf_groups() for name, t in group}

    def set_reference_to_current(self) -> None:
        """Freeze the current weights as the KL reference (a copy of this rank's shards, no optimizer state)."""
        self.reference_state = {n: p.detach().clone() for n, p in self.model.named_parameters()}

    def _swap_in_reference_weights(self):
        return weights_swapped_in(self.model, self.reference_state)

    # ---- scoring ----------------------------------------------------------------------------------
    def _logits(self, input_ids: Tensor) -> Tensor:
        """input_ids [b, T] -> logits [b, T, V], divided by the sampling temperature (right padding needs
        no mask: a causal model never looks at later positions)."""
        logits = self.model(input_ids=input_ids.to(self.device), use_cache=False).logits
        return logits / self.temperature if self.temperature != 1.0 else logits

    @torch.no_grad()
    def score(self, input_ids: Tensor, attention_mask: Tensor, *, with_entropy: bool = False) -> TokenScores:
        """Per-token logprobs (and entropy) [B, T] of ``input_ids`` [B, T]; 0 at position 0 and on padding."""
        self.model.eval()
        logprobs = torch.zeros(input_ids.shape, device=input_ids.device)
        entropy = torch.zeros(input_ids.shape, device=input_ids.device)
        step = self.cfg.logprob_batch_size
        for start in range(0, input_ids.shape[0], step):
            rows = slice(start, start + step)
            t = int(attention_mask[rows].sum(1).max())
            ids, mask = input_ids[rows, :t], attention_mask[rows, :t]
            lp, ent = shifted_logprobs_and_entropy(self._logits(ids), ids.to(self.device), with_entropy)
            logprobs[rows, :t] = lp.to(mask.device) * mask
            if with_entropy:
                entropy[rows, :t] = ent.to(mask.device) * mask
        return TokenScores(logprobs, entropy if with_entropy else None)

    def reference_score(self, input_ids: Tensor, attention_mask: Tensor) -> TokenScores:
        with self._swap_in_reference_weights():
            return self.score(input_ids, attention_mask)

    # ---- training ---------------------------------------------------------------------------------
    def global_counts(self, loss_mask: Tensor) -> LossCounts:
        """Counts over this rank's batch summed over all ranks."""
        local = torch.tensor([int(loss_mask.sum()), int((loss_mask.sum(1) > 0).sum()), loss_mask.shape[0]],
                             dtype=torch.float64, device=self.device)  # NCCL reduces device tensors only
        if self.dp_size > 1:
            dist.all_reduce(local)
        tokens, seqs, n = (int(x) for x in local.tolist())
        return LossCounts(valid_tokens=tokens, valid_sequences=seqs, num_sequences=n)

    def _run_microbatches(self, batch: Trajectories, loss_fn: LossFn, backward: bool) -> tuple[dict[str, float], int]:
        """Loss over ``batch`` in microbatches, normalised by global counts; with ``backward`` the summed
        gradient of the global batch ends up in ``.grad``. Returns global metric sums and microbatch count."""
        counts = self.global_counts(batch.loss_mask)
        mbs = self.cfg.train_micro_batch_size
        starts = list(range(0, batch.batch_size, mbs))
        sums: dict[str, Tensor] = {}
        with torch.set_grad_enabled(backward):
            for i, start in enumerate(starts):
                micro = batch.select(slice(start, start + mbs))
                t = int(micro.attention_mask.sum(1).max())
                ids = micro.input_ids[:, :t]
                if backward:  # reduce-scatter once, after the last microbatch's backward
                    self.model.set_requires_gradient_sync(i == len(starts) - 1)
                logprobs, _ = shifted_logprobs_and_entropy(self._logits(ids), ids.to(self.device), False)
                logprobs = logprobs.to(micro.attention_mask.device) * micro.attention_mask[:, :t]  # batch's device
                logprobs = torch.nn.functional.pad(logprobs, (0, micro.input_ids.shape[1] - t))
                loss, metrics = loss_fn(logprobs, micro, counts)
                if backward:
                    loss.backward()
                for k, v in metrics.items():
                    sums[k] = sums.get(k, 0.0) + torch.as_tensor(v).detach().double()
        return sum_metrics_over_ranks(sums, dist.group.WORLD, self.device), len(starts)

    def _grad_norm(self) -> float:
        sq = torch.zeros((), dtype=torch.float64, device=self.device)
        for p in self.model.parameters():
            if p.grad is not None:
                sq += _local(p.grad).double().pow(2).sum()
        if self.dp_size > 1:
            dist.all_reduce(sq)  # FSDP shards are disjoint: the squares add up
        return float(sq.sqrt())

    def close(self) -> None:
        """Release the model and optimizer (the process group stays for whatever comes next)."""
        self.model = None
        self.optimizer = None
        self.reference_state = None

    def __repr__(self) -> str:
        a = self.arch
        return (f"DTensorPolicy({a.family}, {a.num_layers}x{a.hidden_size}, FSDP2 over {self.dp_size} rank(s), "
                f"version={self.version})")
