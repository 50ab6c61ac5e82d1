"""CPU stand-ins for the CUDA-only pieces Megatron-Core 0.16 needs, applied only when CUDA is absent.

Megatron-Core targets GPUs; on a CPU machine (our CI, a laptop) five things break and nothing else:

1. ``torch.cuda.current_device()`` is called to pick a device for buffers (the attention memory buffer, RoPE
   frequencies, tensor-parallel gathers). Without CUDA it raises. We make it return ``"cpu"``, which every
   one of those call sites accepts as a ``device=`` argument.
2. The RNG state tracker (``tensor_parallel.random``) forks *CUDA* generator states so that dropout differs
   across tensor-parallel ranks. We install a tracker with the same interface that forks the CPU generator,
   so the stock ``model_parallel_cuda_manual_seed`` works unchanged.
3. Causal attention by mask type (no mask tensor passed): the local spec's softmax builds the [T, T] causal
   mask with a literal ``device="cuda"`` (``get_default_causal_mask``), and a sliding window's mask (Gemma 3's
   local layers, ``get_sliding_window_causal_mask``) the same way. We replace both with the same masks made on
   the CPU, cached per shape.
4. Pipeline parallelism: the schedules allocate their token counter with a literal ``device="cuda"``, and
   a tied embedding's last-stage copy is moved with ``.cuda()`` while the model is built.
   :func:`cuda_literals_on_cpu` (a ``TorchFunctionMode`` around those calls only, not a global patch)
   keeps such tensors on the CPU.
5. Activation recompute (``recompute_granularity``): Megatron's checkpoint saves and restores the CUDA
   generator's state around the recomputed forward. There is none: the CPU generator (saved by the same
   code) and the tracker's states are all there is, so the CUDA state is an empty tensor and setting it
   does nothing.

The first three and the fifth are process-wide and applied once. On a CUDA machine :func:`apply_cpu_fallbacks` does
nothing, so the same policy code runs on GPUs with Megatron's own implementations.
"""

from __future__ import annotations

import contextlib
import functools

import torch
from megatron.core.tensor_parallel.random import CudaRNGStatesTracker
from torch.overrides import TorchFunctionMode


class CPURNGStatesTracker(CudaRNGStatesTracker):
    """Megatron's ``CudaRNGStatesTracker`` (its bookkeeping: reset, get and set states) over named CPU generator
    states."""

    def add(self, name: str, seed: int) -> None:
        if seed in self.seeds_:
            raise ValueError(f"RNG seed {seed} already registered")
        if name in self.states_:
            raise ValueError(f"RNG state {name!r} already registered")
        self._is_initialized = True
        self.seeds_.add(seed)
        self.states_[name] = torch.Generator().manual_seed(seed).get_state()

    @contextlib.contextmanager
    def fork(self, name: str = "model-parallel-rng"):
        if name not in self.states_:
            raise KeyError(f"RNG state {name!r} was never added")
        outer = torch.get_rng_state()
        torch.set_rng_state(self.states_[name])
        try:
            yield
        finally:
            self.states_[name] = torch.get_rng_state()
            torch.set_rng_state(outer)


@functools.cache
def apply_cpu_fallbacks() -> bool:
    """Install the CPU stand-ins (once) if CUDA is unavailable. Returns True when they are in effect."""
    if torch.cuda.is_available():
        return False
    from megatron.core.fusions import fused_softmax
    from megatron.core.tensor_parallel import random as mcore_random

    torch.cuda.current_device = lambda: "cpu"  # type: ignore[assignment]
    fused_softmax.get_default_causal_mask = causal_mask_on_cpu
    fused_softmax.get_sliding_window_causal_mask = sliding_window_mask_on_cpu
    mcore_random._CUDA_RNG_STATE_TRACKER = CPURNGStatesTracker()
    mcore_random._CUDA_RNG_STATE_TRACKER_INITIALIZED = True
    mcore_random._get_cuda_rng_state = lambda *_, **__: torch.empty(0, dtype=torch.uint8)
    mcore_random._set_cuda_rng_state = lambda *_, **__: None
    return True


@functools.lru_cache(maxsize=8)
def causal_mask_on_cpu(sq: int) -> torch.Tensor:
    """Megatron's default causal mask [sq, sq] (True above the diagonal: masked out), on the CPU."""
    return torch.triu(torch.ones(sq, sq, dtype=torch.bool), diagonal=1)


@functools.lru_cache(maxsize=8)
def sliding_window_mask_on_cpu(sq: int, skv: int, window_size: tuple[int, int]) -> torch.Tensor:
    """Megatron's sliding-window causal mask [sq, skv] (True: masked out), on the CPU: the last ``sq`` queries of
    ``skv`` positions each see ``window_size[0]`` keys before it and ``window_size[1]`` after it."""
    m = torch.ones(sq, skv, dtype=torch.bool)
    return ~torch.tril(torch.triu(m, diagonal=skv - sq - window_size[0]), diagonal=skv - sq + window_size[1])


class _CudaLiteralsOnCpu(TorchFunctionMode):
    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if func is torch.Tensor.cuda:
            return args[0]
        if str(kwargs.get("device", "")).startswith("cuda"):
            kwargs = dict(kwargs, device="cpu")
        return func(*args, **kwargs)


def cuda_literals_on_cpu():
    """A context in which ``torch.*(..., device="cuda")`` creates CPU tensors and ``Tensor.cuda()`` stays on the
    CPU, when CUDA is absent (else a no-op context). Wraps Megatron's model construction and pipeline
    schedule calls only."""
    return contextlib.nullcontext() if torch.cuda.is_available() else _CudaLiteralsOnCpu()


def return_freed_pages_after_each_layer(model) -> None:
    """On the CPU, glibc keeps the pages a decoder layer's freed working tensors leave in its heap (blocks under its
    mmap threshold, :mod:`rlkit.host_memory`), and over a train step's 28 layers of forward and backward they pile up
    under the step's peak (the Qwen3-0.6B shape with adapters: +300-400 MB of free pages resident at its end). Each
    ``TransformerLayer`` of ``model`` hands them back (``malloc_trim``) once its training forward is done (the first
    pass of a recomputed layer, which runs without autograd) and once its backward is done (a hook on its input's
    gradient). Neither changes a value; a trim walks the free blocks of the heap (milliseconds), and the pages it
    hands back are faulted in and zeroed again by the next layer: CPU for memory, so only with
    ``policy.return_freed_host_memory`` (at the Qwen3-0.6B shape with adapters 2,667 -> 2,581 MB peak, docs/
    measurements.md)."""
    from megatron.core.transformer.transformer_layer import TransformerLayer

    from rlkit import host_memory

    def after_forward(layer, args, kwargs, output):
        x = kwargs.get("hidden_states", args[0] if args else None)
        if torch.is_grad_enabled() and isinstance(x, torch.Tensor) and x.requires_grad:
            x.register_hook(lambda grad: host_memory.release_freed_heap_pages() and None)  # its backward is done
        elif layer.training:
            host_memory.release_freed_heap_pages()

    for module in model.modules():
        if isinstance(module, TransformerLayer):
            module.register_forward_hook(after_forward, with_kwargs=True)
