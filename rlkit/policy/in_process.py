"""What the in-process backends (Megatron-Core and DTensor) share: the whole :class:`rlkit.policy.base.Policy`
contract except the model itself.

A backend subclass builds ``self.model`` and supplies only what differs: the forward pass (``_logits``, raw
logits), logprobs and entropy from logits (vocabulary-parallel or not), the group its rows are split over,
gradient reductions and the gradient norm, HF import/export, and how its parameters are named in a checkpoint.
The calls run this loop -> the backend's hooks, with one hook that calls back: Megatron's fused head hands rows
whose logits fit one chunk to this loop's unfused scores (``super()._forward_scores``). A backend that pipelines
its microbatches supplies a ``_pipeline`` runner, to which the loop hands its own functions.
Everything else is here once: the chunked logprob loop, global token counts, the microbatch loop, the
all-or-nothing optimizer step with Ctrl-C deferred, the KL reference (resident only when used:
:mod:`rlkit.policy.reference`), the learning-rate schedule and the checkpoint state. What leaves memory while a
colocated engine generates is :mod:`rlkit.policy.residency`'s.

Numerics both backends follow: logits divided by the sampling temperature, the loss normalised by counts
over the *global* batch (so gradients are summed, never averaged, over data-parallel ranks), clipping by the
global gradient norm, AdamW with warm-up and decay (:func:`lr_lambda`). At ``policy.precision=bfloat16`` both
compute in bf16 and keep fp32 master weights, gradients and optimizer state (:mod:`rlkit.policy.precision`).
"""

from __future__ import annotations

import contextlib
import math
import time
from collections import Counter
from pathlib import Path
from typing import Mapping, Optional

import torch
import torch.distributed as dist
from torch import Tensor

from rlkit.config.components import OptimizerConfig, PolicyConfig, SchedulerConfig
from rlkit.errors import defer_keyboard_interrupt
from rlkit.policy.base import LossFn, TokenLogprobs, TrainStepResult
from rlkit.policy.optimizer import adamw
from rlkit.policy.packing import PackedRows, pack_rows
from rlkit.policy.reference import ReferenceWeights, swap_all
from rlkit.policy.residency import MemoryResidency
from rlkit.policy.token_budget import microbatch_plan, round_up
from rlkit.trajectories import LossCounts, Trajectories


def sum_metrics_over_ranks(sums: dict[str, Tensor], group, device: torch.device) -> dict[str, float]:
    """Sums (float64 scalars: metric sums, token counts) added up over ``group`` in one all-reduce (on ``device``:
    NCCL reduces device tensors only); unchanged for a group of one (or None: no process group)."""
    if sums and group is not None and dist.get_world_size(group) > 1:
        keys = sorted(sums)
        packed = torch.stack([sums[k].to(device) for k in keys])
        dist.all_reduce(packed, group=group)
        sums = dict(zip(keys, packed))
    return {k: float(v) for k, v in sums.items()}


class InProcessPolicy(MemoryResidency):
    """The shared machinery; a subclass sets ``cfg``, ``model`` and ``device``, then calls ``_start_training``."""

    cfg: PolicyConfig
    model: Optional[torch.nn.Module]
    device: torch.device
    _holds_process_group = False  # a subclass that acquired the default group sets it; close() releases it
    # rank facts (a Ray worker reports them): this rank's data-parallel rank and size, and whether it is the first
    # rank of its data-parallel group (the one whose results are kept)
    dp_rank, dp_size, leader = 0, 1, True
    # a backend that splits the model into pipeline stages runs microbatches through its schedule instead of the
    # plain loop (:class:`rlkit.policy.megatron.pipeline.PipelineSchedule`); None: the plain loop
    _pipeline = None
    # bf16 copy that runs forward and backward while ``model`` holds the fp32 master weights (Megatron at
    # policy.precision=bfloat16; a :class:`rlkit.policy.precision.Bf16Twin`); None when ``model`` itself computes
    _twin = None

    def _start_training(self) -> None:
        """Optimizer, schedule, version 0 and the reference: the state right after the model is loaded."""
        self.temperature = self.cfg.generation.temperature
        self.reset_optimizer(self.cfg.optimizer, self.cfg.scheduler)
        self.version = 0
        # the model folder's weights (just loaded) are the reference; held once something uses it (keep_reference)
        self._reference = ReferenceWeights(self.cfg.model_name)

    # ---- what a backend supplies --------------------------------------------------------------------
    def _rows_group(self):
        """The process group whose ranks hold different rows of a batch (the data-parallel group); None: this
        process alone."""
        raise NotImplementedError

    def _logits(self, input_ids: Tensor) -> Tensor:
        """input_ids [b, t] -> logits [b, t, V] (or this rank's [b, t, V/tp])."""
        raise NotImplementedError

    def _packed_logits(self, packed: PackedRows) -> Tensor:
        """Rows packed into one sequence (``policy.sequence_packing``) -> logits [1, L, V(/tp)], each row attending
        only within itself, its positions restarting at 0."""
        raise NotImplementedError

    def _copy_hf_state(self, hf: Mapping[str, Tensor]) -> None:
        """Copy HF-named full tensors into the model (this rank's shards); strict on names and shapes."""
        raise NotImplementedError

    def _agreed_length(self, t: int) -> int:
        """The forward length this rank uses when its own rows need ``t`` columns (ranks that must run equal
        lengths agree here: Megatron's experts under expert parallelism)."""
        return t

    def _pack(self, input_ids: Tensor, attention_mask: Tensor) -> PackedRows:
        """The rows of ``input_ids`` [b, T] (real tokens where ``attention_mask`` [b, T]) packed into one sequence."""
        return pack_rows(input_ids, attention_mask.sum(1).tolist())

    def _token_logprobs_and_entropy(self, logits: Tensor, input_ids: Tensor,
                                    with_entropy: bool) -> tuple[Tensor, Optional[Tensor]]:
        """Logits [b, t, V(/tp)] and ids [b, t] -> logprobs [b, t] (position 0: 0), differentiable; with
        ``with_entropy`` also the entropy [b, t] of the distribution that predicted each token (position 0: 0,
        no gradient: a metric), else None."""
        raise NotImplementedError

    def _grad_norm(self) -> float:
        """The global gradient norm over every rank's (sharded) gradients."""
        raise NotImplementedError

    def _reduce_grads(self) -> None:
        """Sum gradients over the ranks that hold the same weights (FSDP does it during backward)."""

    def _release_gradient_buffers(self) -> None:
        """Free the memory gradients accumulate in between steps, if the backend keeps it (Megatron's DDP
        buffers); their contents are dropped. Undone by :meth:`_reallocate_gradient_buffers`."""

    def _reallocate_gradient_buffers(self) -> None:
        """Allocate (zeroed) what :meth:`_release_gradient_buffers` freed."""

    def _microbatch_starting(self, index: int, count: int) -> None:
        """Called before the backward microbatch ``index`` of ``count`` (FSDP: sync gradients on the last)."""

    def _forward_length(self, attention_mask: Tensor) -> int:
        """Columns of ``attention_mask`` [b, T] a forward pass needs: up to the longest row (right padding),
        rounded up to ``policy.dynamic_batching.sequence_length_round`` when that is on (at most T)."""
        longest = int(attention_mask.sum(1).max())
        dynamic = self.cfg.dynamic_batching
        if dynamic.enabled:
            longest = min(attention_mask.shape[1], round_up(longest, dynamic.sequence_length_round))
        return self._agreed_length(longest)

    def _scores(self, logits: Tensor, input_ids: Tensor, with_entropy: bool) -> tuple[Tensor, Optional[Tensor]]:
        """Raw logits [b, t, V(/tp)] -> logprobs (and entropy) [b, t] of the sampling distribution (the logits
        divided by the sampling temperature)."""
        if self.temperature != 1.0:
            logits = logits / self.temperature
        return self._token_logprobs_and_entropy(logits, input_ids.to(logits.device), with_entropy)

    def _forward_scores(self, input_ids: Tensor, with_entropy: bool, packed: Optional[PackedRows] = None,
                        scored: Optional[Tensor] = None) -> tuple[Tensor, Optional[Tensor]]:
        """One forward pass of ``input_ids`` [b, t] (or of the ``packed`` rows, whose ids they are) -> logprobs
        (and entropy) [b, t] of the sampling distribution; a backend that fuses its head with the scores
        supplies its own, which may leave 0 where ``scored`` ([b, t] bool, the ids' layout) is False (here every
        position is scored)."""
        logits = self._logits(input_ids) if packed is None else self._packed_logits(packed)
        return self._scores(logits, input_ids, with_entropy)

    def _shared_prompt_scores(self, input_ids: Tensor, attention_mask: Tensor, with_entropy: bool,
                              scored: Tensor) -> Optional[list[Tensor]]:
        """What :meth:`_per_token` returns, from one forward pass that computes each group's shared prompt once,
        where the backend does so (Megatron: ``policy.megatron_cfg.share_prompts``); None: the ordinary rows."""
        return None

    @property
    def returns_step_logprobs(self) -> bool:
        """Whether a train step can return its logprobs (the backend contract): not through a pipeline, whose last
        stage alone sees the logits."""
        return self._pipeline is None

    # ---- optimizer and reference --------------------------------------------------------------------
    def reset_optimizer(self, optimizer: OptimizerConfig, scheduler: SchedulerConfig) -> None:
        """A fresh AdamW over the trainable parameters (with ``policy.lora_cfg`` the adapters only) and learning-rate
        schedule (e.g. between an SFT warm start and RL). An offloaded state is dropped, not brought back (the new
        optimizer starts empty)."""
        if self._offloaded_state is not None:
            self._offloaded_state = {}  # still offloaded: the gradient buffers come back at the next step
        self.optimizer, self.scheduler = adamw([p for p in self.model.parameters() if p.requires_grad], optimizer,
                                               scheduler)

    # ---- the KL reference (rlkit.policy.reference) ----------------------------------------------------
    # Whether the reference costs a copy of the weights. The seam for low-rank adapters: a policy whose reference is
    # its base model with the adapters switched off sets this False and overrides _reference_weights_in.
    reference_needs_copy = True

    def keep_reference(self, needed: bool) -> None:
        """Whether the reference is used (a KL penalty in the loss or the reward: the session's
        ``needs_reference`` rule; the builder says so once the loss is known). Needed: held from now on (loaded,
        if it is not, from the live weights or the model folder). Not needed: none held, unless dropping it would
        lose it (a reference frozen after training that cannot be rebuilt)."""
        self._reference.wanted, self._reference.needs_copy = needed, self.reference_needs_copy
        if needed and self.reference_needs_copy:
            self._hold_reference()
        elif not needed and self._reference.recoverable():
            self._reference.tensors = None

    def set_reference_to_current(self) -> None:
        """Freeze the current weights as the KL reference (a copy of this rank's shards, no optimizer state);
        nothing is copied while the reference is known to be unused (:meth:`keep_reference`)."""
        self._reference.frozen_now()
        if self._reference.wanted is not False and self.reference_needs_copy:
            self._hold_reference()

    @property
    def reference_state(self) -> Optional[dict[str, Tensor]]:
        """The held reference (parameter name -> this rank's shard), or None when none is resident."""
        return self._reference.tensors

    def reference_residency(self) -> str:
        """What the reference costs in memory now, and why, in words."""
        self._reference.needs_copy = self.reference_needs_copy
        return self._reference.residency()

    def _hold_reference(self) -> None:
        """Make the reference resident: a copy of the live weights while they are still the reference, else the
        model folder's weights (loaded into the model, then swapped out: the live weights come back unchanged)."""
        ref = self._reference
        if ref.tensors is not None:
            return
        params = dict(self.model.named_parameters())
        if ref.is_current:
            ref.tensors = {n: p.detach().clone() for n, p in params.items()}
            return
        if ref.folder is None:
            raise ref.unavailable()
        from rlkit.policy.architecture import load_hf_state

        with torch.no_grad():
            held = {n: p.detach().clone() for n, p in params.items()}  # becomes the reference after the swap
            self.load_hf_state(load_hf_state(ref.folder))
            swap_all(params, held)
        ref.tensors = held
        self._master_weights_changed()  # the live masters are back: refresh a bf16 copy
        ref.is_current = False

    @contextlib.contextmanager
    def _reference_weights_in(self):
        """The model computes with the reference weights inside the block; the live weights come back after, even
        if the block raises. The held reference is swapped into the parameters in place (no clone); a bf16 compute
        copy gets the reference and is pulled back from the fp32 masters after."""
        if not self.reference_needs_copy:  # the base model with the adapters off (rlkit.policy.lora.AdapterReference)
            with self._adapters_disabled():
                yield
            return
        self._hold_reference()
        ref = self._reference.tensors
        if self._twin is not None:
            with torch.no_grad():
                for name, param in self._twin.compute.named_parameters():
                    param.copy_(ref[name])
            try:
                yield
            finally:
                self._twin.pull()
            return
        params = dict(self.model.named_parameters())
        swap_all(params, ref)
        try:
            yield
        finally:
            swap_all(params, ref)

    # ---- logprobs -----------------------------------------------------------------------------------
    @torch.no_grad()
    def logprobs(self, input_ids: Tensor, attention_mask: Tensor, *, with_entropy: bool = False,
                 scored: Optional[Tensor] = None) -> TokenLogprobs:
        """Per-token logprobs (and entropy) [B, T] of ``input_ids`` [B, T] in chunks of
        ``logprob_batch_size`` rows, each trimmed to its longest row; 0 at position 0 and on padding, and
        possibly 0 where ``scored`` [B, T] (bool, e.g. the loss mask) is False: only the positions it marks
        are needed (a fused head then skips the others' logits)."""
        self._frozen_base_in()
        self.model.eval()
        if self._pipeline is not None:
            return self._pipeline.logprobs(input_ids, attention_mask, with_entropy, self.cfg.logprob_batch_size,
                                           self._forward_length, self._scores)
        out = torch.zeros((1 + with_entropy, *input_ids.shape), device=input_ids.device)  # logprobs (, entropy)
        for rows in microbatch_plan(self.cfg, attention_mask, self.cfg.logprob_batch_size, "logprob_mb_tokens",
                                    self._rows_group(), self.device):
            needed = None if scored is None else scored[rows]
            values = self._per_token(input_ids[rows], attention_mask[rows], with_entropy, needed)
            out[:, rows] = torch.stack(values).to(out.device)
        return TokenLogprobs(out[0], out[1] if with_entropy else None)

    def reference_logprobs(self, input_ids: Tensor, attention_mask: Tensor, *,
                           scored: Optional[Tensor] = None) -> TokenLogprobs:
        with self._reference_weights_in():
            return self.logprobs(input_ids, attention_mask, scored=scored)

    # ---- training -----------------------------------------------------------------------------------
    def global_counts(self, loss_mask: Tensor) -> LossCounts:
        """Counts over this rank's rows summed over the data-parallel group."""
        local = {"valid_tokens": loss_mask.sum(), "valid_sequences": (loss_mask.sum(1) > 0).sum(),
                 "num_sequences": torch.tensor(loss_mask.shape[0])}
        total = sum_metrics_over_ranks({k: v.double() for k, v in local.items()}, self._rows_group(), self.device)
        return LossCounts(**{k: int(v) for k, v in total.items()})

    def _per_token(self, input_ids: Tensor, attention_mask: Tensor, with_entropy: bool,
                   scored: Optional[Tensor] = None) -> list[Tensor]:
        """[logprobs] or with ``with_entropy`` [logprobs, entropy] of the rows ``input_ids`` [b, T], each [b, T]
        with 0 at position 0 and on padding (and possibly where ``scored`` [b, T] is False), from one forward
        pass (the rows packed into one sequence with ``policy.sequence_packing``, else trimmed to
        :meth:`_forward_length`)."""
        width = input_ids.shape[1]
        shared = None if scored is None else self._shared_prompt_scores(input_ids, attention_mask, with_entropy, scored)
        if shared is not None:
            return shared
        if self.cfg.sequence_packing.enabled:
            packed = self._pack(input_ids, attention_mask)
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
        if self._pipeline is not None:
            t = self._forward_length(batch.attention_mask)

            def micro_loss(logits: Tensor, micro: Trajectories) -> tuple[Tensor, dict[str, Tensor]]:
                logprobs, _ = self._scores(logits, micro.input_ids[:, :t], with_entropy=False)
                logprobs = logprobs.to(micro.input_ids.device) * micro.attention_mask[:, :t]
                return self._loss_of(torch.nn.functional.pad(logprobs, (0, micro.input_ids.shape[1] - t)), micro,
                                     loss_fn, counts)
            return self._pipeline.losses(batch, self.cfg.train_micro_batch_size, t, micro_loss, backward)
        sums: Counter[str] = Counter()  # float64 scalar tensors summed over microbatches
        plan = microbatch_plan(self.cfg, batch.attention_mask, self.cfg.train_micro_batch_size, "train_mb_tokens",
                               self._rows_group(), self.device)
        for i, rows in enumerate(plan):
            micro = batch.select(rows)
            if backward:
                self._microbatch_starting(i, len(plan))
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
        self._frozen_base_in()
        counts = self.global_counts(batch.loss_mask)
        with torch.set_grad_enabled(backward):
            sums, n_micro = self._microbatch_losses(batch, loss_fn, counts, backward, kept)
        if backward:
            self._reduce_grads()
        return sum_metrics_over_ranks(sums, self._rows_group(), self.device), n_micro

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
            grad_norm = self._grad_norm()
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
    def hf_state_dict(self) -> dict[str, Tensor]:
        return {name: t.clone() for group in self.export_hf_groups() for name, t in group}

    def parallel_layout(self) -> dict[str, int | str | bool]:
        """The layout a checkpoint's shards are cut by (a checkpoint loads only under the same one)."""
        raise NotImplementedError

    def _checkpoint_names(self) -> dict[str, str]:
        """Parameter name on this rank -> its name in a checkpoint, unique for every distinct shard."""
        raise NotImplementedError

    def save_state(self, folder: Path) -> None:
        from rlkit.policy.state import save_policy_state

        with self._optimizer_state_in_place():
            save_policy_state(self, Path(folder))

    def load_hf_state(self, hf: Mapping[str, Tensor]) -> None:
        """Load HF-named full tensors (this rank keeps its shards). Strict on names and shapes."""
        self._frozen_base_in()
        self._copy_hf_state(hf)
        self._master_weights_changed()

    def load_state(self, folder: Path) -> None:
        from rlkit.policy.state import load_policy_state

        with self._optimizer_state_in_place():
            load_policy_state(self, Path(folder))
        self._master_weights_changed()

    def _master_weights_changed(self) -> None:
        """Refresh the bf16 compute copy (if any) after the fp32 weights in ``model`` changed; the live weights are
        no longer the reference's."""
        if getattr(self, "_reference", None) is not None:
            self._reference.is_current = False
        if self._twin is not None:
            self._twin.pull()

    def close(self) -> None:
        """Release the model, optimizer and reference, and this policy's hold on the default process group
        (destroyed with its last holder if rlkit created it: :mod:`rlkit.policy.process_group`)."""
        from rlkit.policy.process_group import release_process_group

        self.model = None
        self._twin = None
        self.optimizer = None
        self._offloaded_state = None
        self._reference = ReferenceWeights(None)
        if self._holds_process_group:
            self._holds_process_group = False
            release_process_group()
