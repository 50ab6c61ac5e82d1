"""The training loop every in-process backend runs: the whole :class:`rlkit.policy.base.Policy` contract.

:class:`InProcessPolicy` holds three objects and calls them, none of which calls back: the backend's model
(:class:`rlkit.policy.adapter.ModelAdapter`), the KL reference (:class:`rlkit.policy.reference.Reference`,
resident only when used) and what leaves memory while a colocated engine generates
(:class:`rlkit.policy.residency.Residency`). Everything else is here once: the chunked logprob loop, global token
counts, the microbatch plan and loop, the all-or-nothing optimizer step with Ctrl-C deferred, the learning-rate
schedule and the checkpoint state (:mod:`rlkit.policy.state`).

Numerics every backend follows: logits divided by the sampling temperature, the loss normalised by counts
over the *global* batch (so gradients are summed, never averaged, over data-parallel ranks), clipping by the
global gradient norm, AdamW with warm-up and decay (:func:`lr_lambda`). At ``policy.precision=bfloat16`` both
compute in bf16 and keep fp32 master weights, gradients and optimizer state (:mod:`rlkit.policy.precision`).
"""

from __future__ import annotations

import math
import time
from collections import Counter
from pathlib import Path
from typing import Iterator, Mapping, Optional

import torch
import torch.distributed as dist
from torch import Tensor

from rlkit.config.components import GenerationConfig, OptimizerConfig, SchedulerConfig
from rlkit.errors import defer_keyboard_interrupt
from rlkit.generation.base import Generator
from rlkit.policy.adapter import ModelAdapter, Scores
from rlkit.policy.base import LossFn, TokenLogprobs, TrainStepResult
from rlkit.policy.optimizer import adamw
from rlkit.policy.packing import PackedRows
from rlkit.policy.reference import Reference
from rlkit.policy.residency import Residency
from rlkit.policy.token_budget import microbatch_plan, round_up
from rlkit.trajectories import LossCounts, Trajectories
from rlkit.weights import HFGroup


def sum_metrics_over_ranks(sums: dict[str, Tensor], group, device: torch.device) -> dict[str, float]:
    """Sums (float64 scalars: metric sums, token counts) added up over ``group`` in one all-reduce (on ``device``:
    NCCL reduces device tensors only); unchanged for a group of one (or None: no process group)."""
    if sums and group is not None and dist.get_world_size(group) > 1:
        keys = sorted(sums)
        packed = torch.stack([sums[k].to(device) for k in keys])
        dist.all_reduce(packed, group=group)
        sums = dict(zip(keys, packed))
    return {k: float(v) for k, v in sums.items()}


class InProcessPolicy:
    """A backend's model (``adapter``, built and loaded) trained in this process: a :class:`rlkit.policy.base.Policy`."""

    def __init__(self, adapter: ModelAdapter):
        self.adapter = adapter
        self.temperature = adapter.cfg.generation.temperature
        self.residency = Residency(adapter)
        self.reference = Reference(adapter)  # the model folder's weights (just loaded); held once something uses it
        self.reset_optimizer(adapter.cfg.optimizer, adapter.cfg.scheduler)
        self.version = 0
        # with policy.lora_cfg: the adapters as they started (small), which reset_adapters() puts back
        self._initial_adapters = ([p.detach().clone() for p in self.model.parameters() if p.requires_grad]
                                  if adapter.cfg.lora_cfg.enabled else None)

    # what the adapter holds, read through the policy; a new cfg (e.g. another microbatch size) is the adapter's too
    cfg = property(lambda self: self.adapter.cfg, lambda self, cfg: setattr(self.adapter, "cfg", cfg))
    model = property(lambda self: self.adapter.model)
    device = property(lambda self: self.adapter.device)
    dp_rank = property(lambda self: self.adapter.dp_rank)
    dp_size = property(lambda self: self.adapter.dp_size)
    leader = property(lambda self: self.adapter.leader)

    # not through a pipeline, whose last stage alone sees the logits
    returns_step_logprobs = property(lambda self: self.adapter.pipeline is None)

    def _forward_length(self, attention_mask: Tensor) -> int:
        """Columns of ``attention_mask`` [b, T] a forward pass needs: up to the longest row (right padding),
        rounded up to ``policy.dynamic_batching.sequence_length_round`` when that is on (at most T)."""
        longest = int(attention_mask.sum(1).max())
        dynamic = self.cfg.dynamic_batching
        if dynamic.enabled:
            longest = min(attention_mask.shape[1], round_up(longest, dynamic.sequence_length_round))
        return self.adapter.agreed_length(longest)

    def _scores(self, logits: Tensor, input_ids: Tensor, with_entropy: bool) -> Scores:
        """Raw logits [b, t, V(/tp)] -> logprobs (and entropy) [b, t] of the sampling distribution (the logits
        divided by the sampling temperature)."""
        if self.temperature != 1.0:
            logits = logits / self.temperature
        return self.adapter.token_logprobs_and_entropy(logits, input_ids.to(logits.device), with_entropy)

    def _forward_scores(self, input_ids: Tensor, with_entropy: bool, packed: Optional[PackedRows] = None,
                        scored: Optional[Tensor] = None) -> Scores:
        """One forward pass of ``input_ids`` [b, t] (or of the ``packed`` rows, whose ids they are) -> logprobs
        (and entropy) [b, t] of the sampling distribution: the adapter's fused head where it has one (which may
        leave 0 where ``scored``, [b, t] bool in the ids' layout, is False), else from the full logits."""
        fused = self.adapter.fused_scores(input_ids, with_entropy, self.temperature, packed, scored)
        if fused is not None:
            return fused
        logits = self.adapter.logits(input_ids) if packed is None else self.adapter.packed_logits(packed)
        return self._scores(logits, input_ids, with_entropy)

    # ---- optimizer ----------------------------------------------------------------------------------
    def reset_optimizer(self, optimizer: OptimizerConfig, scheduler: SchedulerConfig) -> None:
        """A fresh AdamW over the trainable parameters (with ``policy.lora_cfg`` the adapters only) and learning-rate
        schedule (e.g. between an SFT warm start and RL). An offloaded state is dropped, not brought back (the new
        optimizer starts empty)."""
        if self.residency.offloaded is not None:
            self.residency.offloaded = {}  # still offloaded: the gradient buffers come back at the next step
        self.optimizer, self.scheduler = adamw([p for p in self.model.parameters() if p.requires_grad], optimizer,
                                               scheduler)

    def grad_norm(self) -> float:  # of what ``.grad`` holds now, over every rank's shards
        return self.adapter.grad_norm()

    # ---- the KL reference (rlkit.policy.reference; the methods' words are the Policy protocol's) ------------
    def keep_reference(self, needed: bool) -> None:
        self.reference.keep(needed)

    def set_reference_to_current(self) -> None:
        self.reference.freeze_current()

    reference_state = property(lambda self: self.reference.tensors)  # name -> this rank's shard; None: not held

    def reference_residency(self) -> str:
        return self.reference.residency()

    # ---- logprobs -----------------------------------------------------------------------------------
    @torch.no_grad()
    def logprobs(self, input_ids: Tensor, attention_mask: Tensor, *, with_entropy: bool = False,
                 scored: Optional[Tensor] = None) -> TokenLogprobs:
        """Per-token logprobs (and entropy) [B, T] of ``input_ids`` [B, T] in chunks of
        ``logprob_batch_size`` rows, each trimmed to its longest row; 0 at position 0 and on padding, and
        possibly 0 where ``scored`` [B, T] (bool, e.g. the loss mask) is False: only the positions it marks
        are needed (a fused head then skips the others' logits)."""
        self.residency.base_in()
        self.model.eval()
        if self.adapter.pipeline is not None:
            return self.adapter.pipeline.logprobs(input_ids, attention_mask, with_entropy,
                                                  self.cfg.logprob_batch_size, self._forward_length, self._scores)
        out = torch.zeros((1 + with_entropy, *input_ids.shape), device=input_ids.device)  # logprobs (, entropy)
        for rows in microbatch_plan(self.cfg, attention_mask, self.cfg.logprob_batch_size, "logprob_mb_tokens",
                                    self.adapter.rows_group(), self.device):
            needed = None if scored is None else scored[rows]
            values = self._per_token(input_ids[rows], attention_mask[rows], with_entropy, needed)
            out[:, rows] = torch.stack(values).to(out.device)
        return TokenLogprobs(out[0], out[1] if with_entropy else None)

    def reference_logprobs(self, input_ids: Tensor, attention_mask: Tensor, *,
                           scored: Optional[Tensor] = None) -> TokenLogprobs:
        with self.reference.weights_in():
            return self.logprobs(input_ids, attention_mask, scored=scored)

    # ---- training -----------------------------------------------------------------------------------
    def global_counts(self, loss_mask: Tensor) -> LossCounts:
        """Counts over this rank's rows summed over the data-parallel group."""
        local = {"valid_tokens": loss_mask.sum(), "valid_sequences": (loss_mask.sum(1) > 0).sum(),
                 "num_sequences": torch.tensor(loss_mask.shape[0])}
        total = sum_metrics_over_ranks({k: v.double() for k, v in local.items()}, self.adapter.rows_group(),
                                       self.device)
        return LossCounts(**{k: int(v) for k, v in total.items()})

    def _per_token(self, input_ids: Tensor, attention_mask: Tensor, with_entropy: bool,
                   scored: Optional[Tensor] = None) -> list[Tensor]:
        """[logprobs] or with ``with_entropy`` [logprobs, entropy] of the rows ``input_ids`` [b, T], each [b, T]
        with 0 at position 0 and on padding (and possibly where ``scored`` [b, T] is False), from one forward
        pass (the rows packed into one sequence with ``policy.sequence_packing``, else trimmed to
        :meth:`_forward_length`)."""
        width = input_ids.shape[1]
        shared = None if scored is None else self.adapter.shared_prompt_scores(
            input_ids, attention_mask, with_entropy, scored, self.temperature)
        if shared is not None:
            return shared
        if self.cfg.sequence_packing.enabled:
            packed = self.adapter.pack(input_ids, attention_mask)
            needed = None if scored is None else packed.pack(scored.to(torch.int8)).bool()
            values = self._forward_scores(packed.input_ids, with_entropy, packed, needed)
            return [packed.unpack(v, width).to(input_ids.device) for v in values if v is not None]
        t = self._forward_length(attention_mask)
        mask = attention_mask[:, :t]
        values = self._forward_scores(input_ids[:, :t], with_entropy, scored=None if scored is None else scored[:, :t])
        return [torch.nn.functional.pad(v.to(mask.device) * mask, (0, width - t)) for v in values if v is not None]

    @staticmethod
    def _loss_of(logprobs: Tensor, micro: Trajectories, loss_fn: LossFn,
                 counts: LossCounts) -> tuple[Tensor, dict[str, Tensor]]:
        """``loss_fn`` on the microbatch's logprobs [b, T] (0 on padding), its metrics as float64 scalars."""
        loss, metrics = loss_fn(logprobs, micro, counts)
        return loss, {k: torch.as_tensor(v).detach().double() for k, v in metrics.items()}

    def _microbatch_losses(self, batch: Trajectories, loss_fn: LossFn, counts: LossCounts, backward: bool,
                           kept: Optional[Tensor] = None) -> tuple[dict[str, Tensor], int]:
        """One microbatch after another (:func:`rlkit.policy.token_budget.microbatch_plan`), each trimmed to its longest row; returns
        this rank's metric sums and the number of microbatches. With ``kept`` ([2, B, T]), each microbatch's own
        logprobs (0 on padding) and entropy (0 outside the completion), detached, are written into its rows of
        ``kept[0]`` and ``kept[1]``, and the entropy goes to the loss as the logprobs pass's would (its
        ``approx_entropy``). Through a pipeline (no ``kept``: :attr:`returns_step_logprobs`) its schedule runs
        them (and the forward pass), each microbatch's loss from its logits [b, t, V(/tp)] by ``micro_loss``."""
        if self.adapter.pipeline is not None:
            t = self._forward_length(batch.attention_mask)

            def micro_loss(logits: Tensor, micro: Trajectories) -> tuple[Tensor, dict[str, Tensor]]:
                logprobs, _ = self._scores(logits, micro.input_ids[:, :t], with_entropy=False)
                logprobs = logprobs.to(micro.input_ids.device) * micro.attention_mask[:, :t]
                return self._loss_of(torch.nn.functional.pad(logprobs, (0, micro.input_ids.shape[1] - t)), micro,
                                     loss_fn, counts)
            return self.adapter.pipeline.losses(batch, self.cfg.train_micro_batch_size, t, micro_loss, backward)
        sums: Counter[str] = Counter()  # float64 scalar tensors summed over microbatches
        plan = microbatch_plan(self.cfg, batch.attention_mask, self.cfg.train_micro_batch_size, "train_mb_tokens",
                               self.adapter.rows_group(), self.device)
        for i, rows in enumerate(plan):
            micro = batch.select(rows)
            if backward:
                self.adapter.microbatch_starting(i, len(plan))
            # the loss reads the logprobs where the loss mask is (0 elsewhere, as every per-token field)
            logprobs, *entropy = self._per_token(micro.input_ids, micro.attention_mask, with_entropy=kept is not None,
                                                 scored=micro.loss_mask)
            if kept is not None:
                micro = micro.with_(entropy=torch.where(micro.loss_mask, entropy[0].detach(), 0.0))
                kept[0][rows], kept[1][rows] = logprobs.detach(), micro.entropy
            loss, metrics = self._loss_of(logprobs, micro, loss_fn, counts)
            if backward:
                loss.backward()
            sums.update(metrics)
        return sums, len(plan)

    def _run_microbatches(self, batch: Trajectories, loss_fn: LossFn, backward: bool,
                          kept: Optional[Tensor] = None) -> tuple[dict[str, float], int]:
        """The loss over ``batch`` normalised by global counts; with ``backward`` the summed gradient of the
        global batch ends up in ``.grad``. Returns global metric sums and the number of microbatches."""
        self.residency.base_in()
        counts = self.global_counts(batch.loss_mask)
        with torch.set_grad_enabled(backward):
            sums, n_micro = self._microbatch_losses(batch, loss_fn, counts, backward, kept)
        if backward:
            self.adapter.reduce_grads()
        return sum_metrics_over_ranks(sums, self.adapter.rows_group(), self.device), n_micro

    def compute_gradients(self, batch: Trajectories, loss_fn: LossFn) -> dict[str, float]:
        """Fill ``.grad`` of every parameter with the gradient of the global-batch loss; no update (for
        inspecting gradients in a notebook or a test)."""
        self.restore_optimizer_state()
        self.model.train()
        self.optimizer.zero_grad(set_to_none=True)
        metrics, _ = self._run_microbatches(batch, loss_fn, backward=True)
        return metrics

    def evaluate_loss(self, batch: Trajectories, loss_fn: LossFn) -> dict[str, float]:
        """The loss and its metrics on ``batch`` under the current weights, without gradients or update."""
        self.model.eval()
        metrics, _ = self._run_microbatches(batch, loss_fn, backward=False)
        return metrics

    def train_step(self, batch: Trajectories, loss_fn: LossFn, *, return_logprobs: bool = False) -> TrainStepResult:
        """One optimizer step over ``batch`` in microbatches, all or nothing: gradients are accumulated first
        and dropped if anything (a KeyboardInterrupt included) interrupts them; clipping, the optimizer and
        the schedule then run with Ctrl-C deferred, so weights and optimizer state are never half updated."""
        t0 = time.perf_counter()
        self.restore_optimizer_state()
        self.model.train()
        self.optimizer.zero_grad(set_to_none=True)
        if return_logprobs and not self.returns_step_logprobs:
            raise ValueError("with pipeline parallelism only the last stage sees the logits, so a train step returns "
                             "no logprobs (returns_step_logprobs is False): run the logprobs stage first")
        # the step's own logprobs and entropy, each [B, T], filled in microbatch by microbatch
        kept = torch.zeros((2, *batch.loss_mask.shape), device=batch.loss_mask.device) if return_logprobs else None
        try:
            metrics, n_micro = self._run_microbatches(batch, loss_fn, backward=True, kept=kept)
            grad_norm = self.adapter.grad_norm()
            if not math.isfinite(grad_norm):
                raise FloatingPointError(f"gradient norm is {grad_norm}; the step was skipped, weights unchanged")
        except BaseException:
            self.optimizer.zero_grad(set_to_none=True)
            raise
        lr = self.scheduler.get_last_lr()[0]
        with defer_keyboard_interrupt():
            if self.cfg.max_grad_norm is not None:  # scales by max / (norm + 1e-6) when the norm is past max
                torch.nn.utils.clip_grads_with_norm_(self.model.parameters(), self.cfg.max_grad_norm,
                                                     torch.tensor(grad_norm, dtype=torch.float64))
            self.optimizer.step()
            self._master_weights_changed()
            self.scheduler.step()
            self.optimizer.zero_grad(set_to_none=True)
            self.version += 1
        # 0 outside the completion, as the logprobs stage stores them
        logprobs, entropy = (torch.where(batch.loss_mask, kept[0], 0.0), kept[1]) if kept is not None else (None, None)
        return TrainStepResult(metrics=metrics, grad_norm=grad_norm, learning_rate=lr, num_microbatches=n_micro,
                               version=self.version, timings={"train_step": time.perf_counter() - t0},
                               logprobs=logprobs, entropy=entropy)

    # ---- weights and checkpoints --------------------------------------------------------------------
    # (the adapter's words: rlkit.policy.adapter.ModelAdapter)
    def export_hf_groups(self) -> Iterator[HFGroup]:
        return self.adapter.export_hf_groups()

    def hf_state_dict(self) -> dict[str, Tensor]:
        return {name: t.clone() for group in self.export_hf_groups() for name, t in group}

    def export_adapter_tensors(self) -> Iterator[tuple[str, Tensor]]:
        return self.adapter.export_adapter_tensors()

    def own_generator(self, cfg: GenerationConfig, max_model_len: int, seed: int) -> Generator:
        """A generator on this policy's own weights (``policy.generation.backend: megatron``): refit is a version
        bump (:class:`rlkit.weight_sync.SharedWeights`)."""
        return self.adapter.own_generator(cfg, max_model_len, seed)

    def parallel_layout(self) -> dict[str, int | str | bool | None]:
        return self.adapter.parallel_layout()

    def checkpoint_names(self) -> dict[str, str]:
        return self.adapter.checkpoint_names()

    def save_state(self, folder: Path) -> None:
        from rlkit.policy.state import save_policy_state

        with self.residency.in_place(self.optimizer):
            save_policy_state(self, Path(folder))

    def load_hf_state(self, hf: Mapping[str, Tensor]) -> None:
        """Load HF-named full tensors (this rank keeps its shards). Strict on names and shapes."""
        self.residency.base_in()
        self.adapter.copy_hf_state(hf)
        self._master_weights_changed()

    def reset_adapters(self) -> None:
        """With ``policy.lora_cfg``: the adapters back to the values they started with (``Session.reset()``: a run
        from the start, as a fresh Session); nothing without adapters."""
        if self._initial_adapters is None:
            return
        trainable = [p for p in self.model.parameters() if p.requires_grad]
        with torch.no_grad():
            for param, start in zip(trainable, self._initial_adapters, strict=True):
                param.copy_(start)
        self._master_weights_changed()

    def load_state(self, folder: Path) -> None:
        from rlkit.policy.state import load_policy_state

        with self.residency.in_place(self.optimizer):
            load_policy_state(self, Path(folder))
        self._master_weights_changed()

    def sync_compute_copy(self) -> None:
        """Refresh the bf16 compute copy (if any) after the fp32 weights in ``model`` were written."""
        if self.adapter.twin is not None:
            self.adapter.twin.pull()

    def _master_weights_changed(self) -> None:
        self.reference.is_current = False  # the live weights are no longer the reference's
        self.sync_compute_copy()

    # ---- what leaves memory while a colocated engine generates (rlkit.policy.residency) ---------------
    # train_step, compute_gradients, save_state and load_state bring an offloaded state back for their call (the
    # last two offload it again after)
    def offload_optimizer_state(self) -> None:
        self.residency.offload(self.optimizer)

    def release_gradient_buffers(self) -> None:
        self.residency.release_gradient_buffers()

    def restore_optimizer_state(self) -> None:
        self.residency.restore(self.optimizer)

    releases_base_while_generating = property(lambda self: self.cfg.lora_cfg.releases_base)

    def release_frozen_base(self) -> int:
        return self.adapter.release_frozen_base()

    def close(self) -> None:
        """Release the optimizer, the reference and the model (with the adapter's hold on process groups)."""
        self.optimizer = None
        self.residency.offloaded = None
        self.reference.tensors = None
        self.adapter.close()

    def __repr__(self) -> str:
        return f"InProcessPolicy({self.adapter!r}, version={self.version})"
