"""The Megatron-Core policy: a GPTModel built from an HF folder, scored and trained in this process.

Why in-process: a notebook kernel holds the model, so a researcher can change the loss and re-run one
step in seconds. The same class is what a Ray worker runs per rank, so no code here assumes TP=1 or DP=1:
weights are sharded per tensor-parallel rank (and experts per expert-parallel rank), gradients are summed
over the ranks that hold the same weights and see different data, and the loss is normalised by counts
over the global batch.

Deliberate simplifications: plain ``torch.optim.AdamW`` (Megatron's distributed optimizer hard-codes CUDA
in places), fp32 weights, no pipeline parallelism, microbatches run one after another.
"""

from __future__ import annotations

import contextlib
import math
import signal
import threading
import time
from pathlib import Path
from typing import Iterator, Mapping

import torch
import torch.distributed as dist
from torch import Tensor

from rlkit.config.components import OptimizerConfig, PolicyConfig, SchedulerConfig
from rlkit.policy.base import HFGroup, LossFn, TokenScores, TrainStepResult, weights_swapped_in
from rlkit.policy.megatron import convert, parallel
from rlkit.policy.megatron.build import Architecture, build_gpt_model, transformer_config
from rlkit.policy.megatron.scores import shifted_entropy, shifted_token_logprobs
from rlkit.trajectories import LossCounts, Trajectories


def load_hf_state(folder: str | Path) -> dict[str, Tensor]:
    """Every tensor of the safetensors files in an HF model folder."""
    from safetensors.torch import load_file

    state: dict[str, Tensor] = {}
    for file in sorted(Path(folder).glob("*.safetensors")):
        state.update(load_file(str(file)))
    return state


def lr_lambda(cfg: SchedulerConfig):
    """Multiplier of the base learning rate at scheduler step ``s`` (warm-up, then the decay style)."""

    def factor(step: int) -> float:
        if step < cfg.warmup_steps:
            return (step + 1) / cfg.warmup_steps
        if cfg.decay_style == "constant" or cfg.decay_steps is None:
            return 1.0
        progress = min(1.0, (step - cfg.warmup_steps) / cfg.decay_steps)
        shape = 1 - progress if cfg.decay_style == "linear" else 0.5 * (1 + math.cos(math.pi * progress))
        return cfg.min_lr_ratio + (1 - cfg.min_lr_ratio) * shape

    return factor


@contextlib.contextmanager
def defer_keyboard_interrupt():
    """Hold a Ctrl-C / Jupyter stop until the block ends, so an optimizer update is never half applied."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    received = []
    previous = signal.signal(signal.SIGINT, lambda *args: received.append(args))
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, previous)
        if received:
            raise KeyboardInterrupt


def all_or_nothing_step(policy, batch: Trajectories, loss_fn: LossFn) -> TrainStepResult:
    """One optimizer step of ``policy`` over ``batch``, shared by every in-process backend.

    All or nothing: gradients are accumulated first (``policy._run_microbatches``) and dropped if anything,
    a KeyboardInterrupt included, interrupts them; clipping, the optimizer and the scheduler update then
    run with Ctrl-C deferred, so weights and optimizer state are never half updated.
    """
    t0 = time.perf_counter()
    policy.model.train()
    policy.optimizer.zero_grad(set_to_none=True)
    try:
        metrics, n_micro = policy._run_microbatches(batch, loss_fn, backward=True)
        grad_norm = policy._grad_norm()
        if not math.isfinite(grad_norm):
            raise FloatingPointError(f"gradient norm is {grad_norm}; the step was skipped, weights unchanged")
    except BaseException:
        policy.optimizer.zero_grad(set_to_none=True)
        raise
    lr = policy.scheduler.get_last_lr()[0]
    with defer_keyboard_interrupt():
        if policy.cfg.max_grad_norm is not None and grad_norm > policy.cfg.max_grad_norm:
            scale = policy.cfg.max_grad_norm / (grad_norm + 1e-6)
            for p in policy.model.parameters():
                if p.grad is not None:
                    p.grad.mul_(scale)
        policy.optimizer.step()
        policy.scheduler.step()
        policy.optimizer.zero_grad(set_to_none=True)
        policy.version += 1
    return TrainStepResult(metrics=metrics, grad_norm=grad_norm, learning_rate=lr, num_microbatches=n_micro,
                           version=policy.version, timings={"train_step": time.perf_counter() - t0})


class MegatronPolicy:
    """A causal LM on Megatron-Core with HF weights in and out (implements :class:`rlkit.policy.base.Policy`)."""

    def __init__(self, cfg: PolicyConfig, seed: int = 0):
        self.cfg = cfg
        self.arch = Architecture.from_hf_folder(cfg.model_name)
        mc = cfg.megatron_cfg
        self.layout = parallel.ParallelLayout(**mc.model_dump(include=set(parallel.ParallelLayout.__dataclass_fields__)))
        parallel.init_parallel(self.layout, seed)
        self.tp_rank, self.tp_size = parallel.tp_rank_and_size()
        self.model = build_gpt_model(self.arch, transformer_config(self.arch, self.tp_size, mc.sequence_parallel))
        self.load_hf_state(load_hf_state(cfg.model_name))
        self.reset_optimizer(cfg.optimizer, cfg.scheduler)
        self.temperature = cfg.generation.temperature
        self.version = 0
        self.reference_state: dict[str, Tensor] | None = None  # Megatron-named frozen KL reference weights
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
        """Load HF-named full tensors; this rank keeps its tensor-parallel shard. Strict on names and shapes."""
        full = convert.hf_to_megatron(hf, self.arch)
        params = dict(self.model.named_parameters())
        missing = sorted(set(params) - set(full))
        if missing:
            raise KeyError(f"no HF weights for Megatron parameters {missing[:5]}")
        with torch.no_grad():
            for name, param in params.items():
                piece = convert.shard(name, full[name], self.tp_rank, self.tp_size)
                if piece.shape != param.shape:
                    raise ValueError(f"{name}: HF weights give shape {tuple(piece.shape)}, model has {tuple(param.shape)}")
                param.copy_(piece)

    def _full_tensor(self, name: str, params: Mapping[str, Tensor], group=None) -> Tensor:
        """Parameter ``name`` gathered over its tensor-parallel ``group`` (default: Megatron's TP group)."""
        local = params[name].detach()
        group = parallel.tp_group() if group is None else group
        size = dist.get_world_size(group)
        if size == 1 or convert.shard_dim(name) is None:
            return local
        pieces = [torch.empty_like(local) for _ in range(size)]
        dist.all_gather(pieces, local.contiguous(), group=group)
        return convert.unshard(name, pieces)

    def export_hf_groups(self) -> Iterator[HFGroup]:
        """HF-named full tensors, one fused group at a time. At TP=1 they are views of the live weights:
        copy them if you keep them past the next optimizer step."""
        params = dict(self.model.named_parameters())
        yield from convert.megatron_to_hf_groups(lambda n: self._full_tensor(n, params), self.arch)

    def hf_state_dict(self) -> dict[str, Tensor]:
        return {name: t.clone() for group in self.export_hf_groups() for name, t in group}

    def set_reference_to_current(self) -> None:
        """Freeze the current weights as the KL reference (a weight copy, no optimizer state)."""
        self.reference_state = {n: p.detach().clone() for n, p in self.model.named_parameters()}

    def _swap_in_reference_weights(self):
        return weights_swapped_in(self.model, self.reference_state)

    # ---- scoring ----------------------------------------------------------------------------------
    def _logits(self, input_ids: Tensor) -> Tensor:
        """input_ids [b, T] -> logits [b, T, V/tp], divided by the sampling temperature.

        Under sequence parallelism the sequence is split over the tensor-parallel ranks, so it is padded on the
        right to a multiple of their number; causal attention keeps the padding out of the first T positions.
        """
        b, t = input_ids.shape
        padded = t + (-t % self.tp_size if self.layout.sequence_parallel else 0)
        ids = torch.nn.functional.pad(input_ids, (0, padded - t))
        positions = torch.arange(padded).unsqueeze(0).expand(b, padded)
        causal = torch.triu(torch.ones(padded, padded, dtype=torch.bool), diagonal=1)[None, None]
        logits = self.model(ids, positions, causal)[:, :t]
        return logits / self.temperature if self.temperature != 1.0 else logits

    def _forward_length(self, attention_mask: Tensor) -> int:
        """Columns of ``attention_mask`` [b, T] a forward pass needs: up to the longest row (right padding)."""
        return int(attention_mask.sum(1).max())

    @torch.no_grad()
    def score(self, input_ids: Tensor, attention_mask: Tensor, *, with_entropy: bool = False) -> TokenScores:
        """Per-token logprobs (and entropy) [B, T] of ``input_ids`` [B, T]; 0 at position 0 and on padding."""
        self.model.eval()
        logprobs, entropy = torch.zeros(input_ids.shape), torch.zeros(input_ids.shape)
        step = self.cfg.logprob_batch_size
        for start in range(0, input_ids.shape[0], step):
            rows = slice(start, start + step)
            t = self._forward_length(attention_mask[rows])
            ids, mask = input_ids[rows, :t], attention_mask[rows, :t]
            logits = self._logits(ids)
            logprobs[rows, :t] = shifted_token_logprobs(logits, ids) * mask
            if with_entropy:
                entropy[rows, :t] = shifted_entropy(logits, parallel.tp_group()) * mask
        return TokenScores(logprobs, entropy if with_entropy else None)

    def reference_score(self, input_ids: Tensor, attention_mask: Tensor) -> TokenScores:
        with self._swap_in_reference_weights():
            return self.score(input_ids, attention_mask)

    # ---- training ---------------------------------------------------------------------------------
    def global_counts(self, loss_mask: Tensor) -> LossCounts:
        """Counts over this rank's batch summed over the data-parallel group."""
        local = torch.tensor([loss_mask.sum(), (loss_mask.sum(1) > 0).sum(), loss_mask.shape[0]], dtype=torch.float64)
        if parallel.dp_size() > 1:
            dist.all_reduce(local, group=parallel.dp_group())
        tokens, seqs, n = (int(x) for x in local.tolist())
        return LossCounts(valid_tokens=tokens, valid_sequences=seqs, num_sequences=n)

    def _grad_norm(self) -> float:
        from megatron.core.tensor_parallel import param_is_not_tensor_parallel_duplicate

        sq = torch.zeros((), dtype=torch.float64)  # over the parameters every rank holds (TP shards summed)
        expert_sq = torch.zeros((), dtype=torch.float64)  # over the experts split by expert parallelism
        for p in self.model.parameters():
            if p.grad is None:
                continue
            if parallel.is_expert_parallel(p):
                expert_sq += p.grad.double().pow(2).sum()
            elif param_is_not_tensor_parallel_duplicate(p):
                sq += p.grad.double().pow(2).sum()
        if self.tp_size > 1:
            dist.all_reduce(sq, group=parallel.tp_group())
        if parallel.ep_rank_and_size()[1] > 1:  # (experts only split by TP are in ``sq``)
            dist.all_reduce(expert_sq, group=parallel.expert_model_group())
        return float((sq + expert_sq).sqrt())

    def _run_microbatches(self, batch: Trajectories, loss_fn: LossFn, backward: bool) -> tuple[dict[str, float], int]:
        """Loss over ``batch`` in microbatches of ``train_micro_batch_size`` rows, normalised by global counts.

        With ``backward`` the gradients of all microbatches accumulate in ``.grad`` (summed over the
        data-parallel group); returns the global metric sums and the number of microbatches.
        """
        counts = self.global_counts(batch.loss_mask)
        mbs = self.cfg.train_micro_batch_size
        sums: dict[str, Tensor] = {}
        n_micro = 0
        with torch.set_grad_enabled(backward):
            for start in range(0, batch.batch_size, mbs):
                micro = batch.select(slice(start, start + mbs))
                t = self._forward_length(micro.attention_mask)
                ids = micro.input_ids[:, :t]
                logprobs = shifted_token_logprobs(self._logits(ids), ids) * micro.attention_mask[:, :t]
                logprobs = torch.nn.functional.pad(logprobs, (0, micro.input_ids.shape[1] - t))
                loss, metrics = loss_fn(logprobs, micro, counts)
                if backward:
                    loss.backward()
                for k, v in metrics.items():
                    sums[k] = sums.get(k, 0.0) + torch.as_tensor(v).detach().double()
                n_micro += 1
        if backward:
            self._sum_sequence_parallel_grads()
            for p in self.model.parameters():
                group = parallel.grad_reduce_group(p)
                if p.requires_grad and dist.get_world_size(group) > 1:
                    if p.grad is None:  # e.g. an expert no token reached here: every rank must join the sum
                        p.grad = torch.zeros_like(p)
                    dist.all_reduce(p.grad, group=group)
        if parallel.dp_size() > 1:
            for v in sums.values():
                dist.all_reduce(v, group=parallel.dp_group())
        return {k: float(v) for k, v in sums.items()}, n_micro

    def _sum_sequence_parallel_grads(self) -> None:
        """Under sequence parallelism each tensor-parallel rank's norms (and MoE router) saw only its chunk of
        the sequence: sum their gradients over the tensor-parallel group (Megatron marks them
        ``sequence_parallel``)."""
        if not self.layout.sequence_parallel:
            return
        for p in self.model.parameters():
            if p.requires_grad and getattr(p, "sequence_parallel", False):
                if p.grad is None:
                    p.grad = torch.zeros_like(p)
                dist.all_reduce(p.grad, group=parallel.tp_group())

    def compute_gradients(self, batch: Trajectories, loss_fn: LossFn) -> dict[str, float]:
        """Fill ``.grad`` of every parameter with the gradient of the global-batch loss; no update."""
        self.model.train()
        self.optimizer.zero_grad(set_to_none=True)
        metrics, _ = self._run_microbatches(batch, loss_fn, backward=True)
        return metrics

    def evaluate_loss(self, batch: Trajectories, loss_fn: LossFn) -> dict[str, float]:
        """The loss and its metrics on ``batch`` under the current weights, without gradients or update."""
        self.model.eval()
        metrics, _ = self._run_microbatches(batch, loss_fn, backward=False)
        return metrics

    def train_step(self, batch: Trajectories, loss_fn: LossFn) -> TrainStepResult:
        """One optimizer step over ``batch`` in microbatches of ``train_micro_batch_size`` rows.

        All or nothing: gradients are accumulated first and dropped if anything (a KeyboardInterrupt
        included) interrupts them; the optimizer and scheduler update runs with Ctrl-C deferred.
        """
        return all_or_nothing_step(self, batch, loss_fn)

    def close(self) -> None:
        """Release the model and Megatron's global parallel state (a new policy can be built after)."""
        self.model = None
        self.optimizer = None
        self.reference_state = None
        parallel.destroy_parallel()

    def __repr__(self) -> str:
        a = self.arch
        return (
            f"MegatronPolicy({a.family}, {a.num_layers}x{a.hidden_size}, TP={self.tp_size}, "
            f"DP={parallel.dp_size() if self.model is not None else '?'}, version={self.version})"
        )
