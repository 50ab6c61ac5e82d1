"""vLLM generator, in this process (colocated with the policy).

The engine core runs in this process on every device (``VLLM_ENABLE_V1_MULTIPROCESSING=0``; vLLM's default
on a GPU is a separate engine-core process): a refit hands the policy's tensors to vLLM's ``reload_weights`` by
reference, one at a time as the export yields them. On a GPU they are CUDA tensors copied device to device
into the engine: no CUDA IPC handles and no copy through host memory are needed, which is what NeMo-RL's IPC
hand-off achieves between processes. (Through a separate engine-core process the refit could not work at all:
``collective_rpc`` serializes its arguments, and the stream of tensors is a Python generator.)

Settings measured to work on CPU machines (see the project's STACK notes): eager mode (compiling
adds 20-50 s of start-up and no speed), a fixed KV-cache size (``kv_cache_memory_bytes`` from
``vllm_cfg.kv_cache_space_gib``, fractions of a GiB too, by default what a rollout batch needs: the cache is
allocated and zeroed, so it is resident memory; vLLM's automatic size reads NUMA meminfo and has failed), and
``OMP_NUM_THREADS`` set (else the engine drops torch to one thread).

Weights are refit through vLLM's public ``collective_rpc("reload_weights", ...)`` in buckets of whole fused
groups, then the prefix cache is reset: without that reset, later samples reuse attention state computed
with the old weights and their logprobs are silently wrong.

Precision (``vllm_cfg.precision``): float32, bfloat16, or fp8 (bf16 activations, weights quantized to FP8 by
vLLM's online quantization when loaded; vLLM 0.32's layer-by-layer ``reload_weights`` runs that quantization
again on each refit from the bf16/fp32 tensors it receives, so refit needs no FP8 weights). The cost of each
shows as the generator/trainer mismatch (``token_mult_prob_error``).

A stop (Ctrl-C, Jupyter's stop button) takes effect between engine steps and after a weight load, never inside
one: vLLM's state is left half changed there, and its next step or load fails.

Colocated on a GPU, the engine sleeps after each rollout (level 1: weights to CPU memory, KV cache freed), so
the policy trains with that memory, and wakes for the next refit or rollout. vLLM offers sleep mode on
CUDA/ROCm/XPU only. Colocated on a CPU, the engine instead releases its weights while the policy trains
(:meth:`VllmGenerator.release_weights`, ``vllm_cfg.release_weights_for_training``): the refit that follows every
update rebuilds them from the policy's, as vLLM's level-2 sleep (weights discarded) expects a reload to.
"""

from __future__ import annotations

import dataclasses
import functools
import logging
import os
from pathlib import Path
from typing import Callable, Iterable

from tokenizers.decoders import DecodeStream
import torch

from rlkit.config.components import GenerationConfig
from rlkit.config.engines import engine_handoff
from rlkit.errors import ModelError, defer_keyboard_interrupt
from rlkit.generation.base import Generation, SamplingSettings, request_seed
from rlkit.generation.vllm_cpu_kernels import (drop_unused_cpu_embedding_kernels, moe_layers_with_experts_in,
                                               prepack_cpu_moe_experts, reallocate_cpu_embeddings,
                                               redispatch_cpu_tied_layers, release_cpu_weights,
                                               released_cpu_layers)
from rlkit.host_memory import release_freed_heap_pages
from rlkit.memory.plan import GIB, auto_kv_cache_bytes
from rlkit.models.factory import read_hf_config, vllm_cpu_refusal
from rlkit.quiet import quieted


class _ExpectedReloadNotices(logging.Filter):
    """Drops vLLM's "<layer>: Failed to load weights" warnings, logged at every refit, for layers that have
    nothing to load: ``RotaryEmbedding`` (its cos/sin cache is computed, never a checkpoint weight), ``Gemma3Model``
    (its own tensor is the embedding scale sqrt(hidden), a computed buffer: vLLM puts it back) and, once a
    tied-embedding model is loaded, ``ParallelLMHead`` (a tied head has no tensor of its own: it shares the
    embedding's, and :func:`redispatch_cpu_tied_layers` rebuilds its kernel). Other layers' failures still show."""

    def __init__(self):
        super().__init__()
        self.layers = {"RotaryEmbedding", "Gemma3Model"}

    def filter(self, record: logging.LogRecord) -> bool:
        layer, _, rest = record.getMessage().partition(": ")
        return not (rest == "Failed to load weights" and layer in self.layers)


def _quiet_reload_notices(tied_head: bool = False) -> None:
    layerwise = logging.getLogger("vllm.model_executor.model_loader.reload.layerwise")
    notices = next((f for f in layerwise.filters if isinstance(f, _ExpectedReloadNotices)), None)
    if notices is None:
        notices = _ExpectedReloadNotices()
        layerwise.addFilter(notices)
    if tied_head:
        notices.layers.add("ParallelLMHead")


def _whole_steps(step: Callable[[], list]) -> Callable[[], list]:
    """vLLM's engine ``step`` with a stop held until the step ends: a step cut between running the model and
    sampling its tokens leaves the engine refusing every later step ("State error: sample_tokens() must be
    called after execute_model() returns None"), while between steps an interrupted ``generate`` only leaves
    requests to abort (:meth:`VllmGenerator._abort_unfinished`). A step is one forward of the running batch."""

    @functools.wraps(step)
    def whole_step() -> list:
        with defer_keyboard_interrupt():
            return step()

    return whole_step


def _cpu_engine_environment() -> None:
    # no VLLM_CPU_KVCACHE_SPACE: it counts whole GiB and, when set, overrides kv_cache_memory_bytes
    os.environ.setdefault("OMP_NUM_THREADS", str(torch.get_num_threads()))
    os.environ.setdefault("VLLM_LOGGING_LEVEL", "WARNING")
    os.environ.setdefault("TORCHDYNAMO_DISABLE", "1")


DIRECT_ENGINE_SEQUENCES = 32  # what an "auto" KV cache holds at full length in an engine built outside a session
ENGINE_PRECISION: dict[str, dict[str, str]] = {  # vllm_cfg.precision -> LLM(...) arguments
    "float32": {"dtype": "float32"},
    "bfloat16": {"dtype": "bfloat16"},
    "fp8": {"dtype": "bfloat16", "quantization": "fp8"},
}


def sleep_mode_available() -> bool:
    """Whether this machine's vLLM platform can put an engine to sleep (CUDA, ROCm, XPU; not the CPU)."""
    from vllm.platforms import current_platform

    return current_platform.is_sleep_mode_available()


class VllmGenerator:
    """Batched sampling with token ids and logprobs on a vLLM ``LLM`` engine (implements ``Generator``)."""

    def __init__(self, model_path: str | Path, cfg: GenerationConfig, max_model_len: int, seed: int = 0):
        config = read_hf_config(model_path)
        on_cpu = not torch.cuda.is_available()
        os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"  # the engine core in this process (module docstring)
        if on_cpu:
            refusal = vllm_cpu_refusal(config)  # fail here, not at the first generate call deep inside vLLM
            if refusal is not None:
                raise ModelError(refusal)
            _cpu_engine_environment()
        from vllm import LLM

        self.cfg = cfg
        self.model_path = str(model_path)
        self.max_model_len = max_model_len
        self.precision = cfg.vllm_cfg.precision
        # the colocated hand-off (rlkit.config.engines.engine_handoff, which the memory plan reads too): asleep
        # between rollouts so the policy trains with the engine's memory, or on the CPU, the stand-in for sleep,
        # weights released while the colocated policy trains and rebuilt by the refit
        handoff = engine_handoff(cfg, cfg.colocated.enabled is not False, on_cpu, sleep_mode_available())
        self.sleeps_between_rollouts = handoff == "sleep"
        self._asleep = False
        self.releases_weights_for_training = handoff == "release_weights"
        self.weights_released = False
        kwargs = dict(
            model=self.model_path,
            **ENGINE_PRECISION[self.precision],
            enable_sleep_mode=self.sleeps_between_rollouts,
            seed=seed,
            enforce_eager=cfg.vllm_cfg.enforce_eager,
            max_model_len=max_model_len,
            enable_prefix_caching=cfg.vllm_cfg.enable_prefix_caching,
            logprobs_mode="processed_logprobs",
            use_tqdm_on_load=not quieted(),  # no weight-loading bar while a session starts quietly
        )
        if not on_cpu:
            kwargs["gpu_memory_utilization"] = cfg.vllm_cfg.gpu_memory_utilization
        else:  # exact, below 1 GiB too (VLLM_CPU_KVCACHE_SPACE counts whole GiB); it is allocated and zeroed: RSS
            gib = cfg.vllm_cfg.kv_cache_space_gib  # (a session resolves "auto" from its rollout batch)
            kwargs["kv_cache_memory_bytes"] = int(gib * GIB) if gib != "auto" else auto_kv_cache_bytes(
                config, self.precision, max_model_len, sequences=DIRECT_ENGINE_SEQUENCES)
        self.llm = LLM(**kwargs)
        if on_cpu:
            self.llm.collective_rpc(drop_unused_cpu_embedding_kernels)
            release_freed_heap_pages()
        self.llm.llm_engine.step = _whole_steps(self.llm.llm_engine.step)
        self.tokenizer = self.llm.get_tokenizer()
        # decode_completions needs the tokenizers library's decoder; a Python-only tokenizer is left to vLLM
        self.caller_decodes = hasattr(self.tokenizer, "backend_tokenizer")
        _quiet_reload_notices(tied_head=bool(config.get("tie_word_embeddings")))

    def generate(self, prompt_token_ids: list[list[int]], n: int, sampling: SamplingSettings) -> Generation:
        return decode_completions(self.sample(prompt_token_ids, n, sampling), self.tokenizer)

    def sample(self, prompt_token_ids: list[list[int]], n: int, sampling: SamplingSettings) -> Generation:
        """``generate`` without decoding the completions: ``texts`` is None unless stop strings are set or the
        tokenizer is a Python-only one (:func:`decode_completions` fills them in, ~1 us per token).

        Why: vLLM then skips its per-token detokenization and the decoded token it attaches to each logprob
        (figures: docs/measurements.md), and an engine in another process leaves the decoding to its caller
        (async GRPO: the trainer's process, which waits on the engine anyway).
        Stop strings need the engine to decode: it looks for them in the text as it grows."""
        from vllm import SamplingParams

        too_long = [len(p) for p in prompt_token_ids if len(p) + sampling.max_new_tokens > self.max_model_len]
        if too_long:
            raise ValueError(
                f"{len(too_long)} prompt(s) of up to {max(too_long)} tokens plus max_new_tokens="
                f"{sampling.max_new_tokens} exceed max_model_len={self.max_model_len}. Fix: raise "
                f"policy.max_total_sequence_length or lower policy.generation.max_new_tokens."
            )
        if self.weights_released:
            raise RuntimeError(
                "the engine released its weights for the policy's train step (policy.generation.vllm_cfg."
                "release_weights_for_training) and has not been refit since. Fix: session.refit() (a session's "
                "rollout(), step() and evaluate() refit first by themselves).")
        engine_decodes = self.engine_decodes(sampling)
        params = [
            SamplingParams(
                n=n,
                temperature=sampling.temperature,
                top_p=sampling.top_p,
                top_k=sampling.top_k or 0,
                max_tokens=sampling.max_new_tokens,
                stop=list(sampling.stop_strings) or None,
                logprobs=0,
                flat_logprobs=True,  # plain lists of floats, not a dict of Logprob objects per token
                detokenize=engine_decodes,
                seed=None if sampling.seed is None else request_seed(sampling.seed, i, n),
            )
            for i in range(len(prompt_token_ids))
        ]
        prompts = [{"prompt_token_ids": list(p)} for p in prompt_token_ids]
        outputs = []
        self.wake_up()
        try:
            for rows in self._unchunked_calls(prompt_token_ids, n):
                outputs += self.llm.generate([prompts[i] for i in rows], [params[i] for i in rows], use_tqdm=False)
        except BaseException:  # a KeyboardInterrupt (Jupyter's stop) mid-generation
            self._abort_unfinished()
            raise
        finally:
            self.sleep()
        samples = [
            (sample.token_ids, [sample.logprobs.logprobs[j] for j in sample.logprobs.start_indices],  # sampled first
             sample.text, "length" if sample.finish_reason == "length" else "stop")
            for request in outputs for sample in request.outputs
        ]
        generation = Generation.from_samples(prompt_token_ids, samples, n)
        return generation if engine_decodes else dataclasses.replace(generation, texts=None)

    def engine_decodes(self, sampling: SamplingSettings) -> bool:
        """Whether :meth:`sample` has vLLM detokenize (stop strings, or a Python-only tokenizer)."""
        return bool(sampling.stop_strings) or not self.caller_decodes

    def _unchunked_calls(self, prompt_token_ids: list[list[int]], n: int) -> list[range]:
        """Split the prompts into calls whose prefills all fit in the engine's first scheduler step.

        vLLM rewinds a seeded request's generator when its prefill is split over steps, which CPU
        generators cannot do ("CPU Generator does not use offset"). Keeping every call's prefill within
        one step's token and sequence budget avoids the split and keeps per-request seeds usable.
        """
        sched = self.llm.llm_engine.vllm_config.scheduler_config
        calls, start, tokens = [], 0, 0
        for i, prompt in enumerate(prompt_token_ids):
            cost = len(prompt) * n
            if i > start and (tokens + cost > sched.max_num_batched_tokens or (i - start + 1) * n > sched.max_num_seqs):
                calls.append(range(start, i))
                start, tokens = i, 0
            tokens += cost
        calls.append(range(start, len(prompt_token_ids)))
        return calls

    def update_weights(self, weights: Iterable[tuple[str, torch.Tensor]]) -> None:
        """Load HF-named tensors in one ``reload_weights`` call, consuming ``weights`` one tensor at a time
        (vLLM processes each layer once its last tensor arrives), so a whole refit can stream through one
        call: every call also walks all of the engine's modules twice, a fixed cost per call.

        A stop (Ctrl-C, Jupyter's stop button) during the load takes effect when the load ends: vLLM takes
        each layer apart while it loads, and a load cut short leaves layers that no later load can fill."""
        self.wake_up()  # a sleeping engine's weights are not in GPU memory
        names: list[str] = []

        def named(pairs):
            for name, tensor in pairs:
                names.append(name)
                yield name, tensor

        with defer_keyboard_interrupt():
            if self.weights_released:
                self.llm.collective_rpc(reallocate_cpu_embeddings)
            self.llm.collective_rpc("reload_weights",
                                    kwargs={"weights_iterator": named(weights), "is_checkpoint_format": True})
            if not torch.cuda.is_available():
                if layers := moe_layers_with_experts_in(names):
                    self.llm.collective_rpc(prepack_cpu_moe_experts, kwargs={"layers": layers})
                self.llm.collective_rpc(redispatch_cpu_tied_layers)
                self.llm.collective_rpc(drop_unused_cpu_embedding_kernels)
            if self.weights_released:
                if missing := self.llm.collective_rpc(released_cpu_layers)[0]:
                    raise RuntimeError(
                        f"the refit did not reload {len(missing)} layer(s) whose weights the engine released for "
                        f"training ({', '.join(missing[:4])}{', ...' if len(missing) > 4 else ''}): a refit after "
                        "a release must send every weight. Fix: set policy.generation.vllm_cfg."
                        "release_weights_for_training=false.")
                self.weights_released = False

    def release_weights(self) -> int:
        """Free the engine's weights while the colocated policy trains (on the CPU, where vLLM has no sleep mode;
        only with ``vllm_cfg.release_weights_for_training``, else nothing): every layer's prepacked matmul kernel
        and the embedding tables. The next :meth:`update_weights` rebuilds them; :meth:`sample` refuses until then.
        Returns the bytes released (0 if nothing was).

        Why it is safe: each refit already rebuilds every kernel from the tensors it loads (vLLM's layer-by-layer
        reload re-processes each layer), so between a rollout and the refit after the train step the kernels hold
        weights that are about to be replaced. A refit that leaves a released layer without a tensor is refused
        (:meth:`update_weights`). Freed blocks go back to the operating system (``malloc_trim``)."""
        if not self.releases_weights_for_training or self.weights_released:
            return 0
        with defer_keyboard_interrupt():
            released = self.llm.collective_rpc(release_cpu_weights)[0]
            self.weights_released = True
        release_freed_heap_pages()
        return released

    def _abort_unfinished(self) -> None:
        """Drop the requests an interrupted ``generate`` left in the engine: left there, the next call waits
        forever on them (the scheduler keeps them running but never finishes them)."""
        engine = self.llm.llm_engine
        if engine.has_unfinished_requests():
            engine.abort_request(list(engine.output_processor.request_states), internal=True)

    def sleep(self) -> None:
        """Release the engine's GPU memory until :meth:`wake_up` (weights kept in CPU memory, KV cache dropped);
        only when colocated on a machine whose vLLM has sleep mode, else nothing."""
        if self.sleeps_between_rollouts and not self._asleep:
            self.llm.sleep(level=1)
            self._asleep = True

    def wake_up(self) -> None:
        """Bring the engine's weights and KV cache back after :meth:`sleep` (nothing if awake)."""
        if self._asleep:
            self.llm.wake_up()
            self._asleep = False

    def reset_prefix_cache(self) -> None:
        self.llm.reset_prefix_cache()

    def close(self) -> None:
        """Shut the engine down now rather than whenever the ``LLM`` is garbage collected: its shutdown
        destroys the process groups (vLLM's and the default one), and run late it would destroy the groups
        of the session built next. Safe twice."""
        if self.llm is not None:
            self.llm.llm_engine.engine_core.shutdown()
        self.llm = None

    def __repr__(self) -> str:
        return f"VllmGenerator({Path(self.model_path).name}, {self.precision}, max_model_len={self.max_model_len})"


def decode_completions(generation: Generation, tokenizer) -> Generation:
    """``generation`` with its ``texts`` decoded from the token ids the way vLLM's detokenizer decodes them;
    itself if it is decoded already. ``tokenizer``: the model's fast (``tokenizers``-backed) HF tokenizer.

    vLLM's rule, followed here: each completion is decoded as it continues its prompt (a decode stream primed
    with the prompt's ids, so a leading space or a byte sequence split across the boundary comes out as in the
    full text), special tokens skipped, and the stop token that ended a sample left out. Only for samples
    without stop strings (:meth:`VllmGenerator.sample` decodes those itself), so a sample that finished with
    "stop" ended on a stop token. Equal to vLLM's own texts on the character and byte-level BPE tokenizers
    (tests/generation/test_vllm_decode.py)."""
    if generation.texts is not None:
        return generation

    backend, g = tokenizer.backend_tokenizer, generation.group_size
    texts = []
    for row, (ids, reason) in enumerate(zip(generation.token_ids, generation.finish_reasons)):
        stream = DecodeStream(ids=list(generation.prompt_token_ids[row // g]), skip_special_tokens=True)
        kept = ids[:-1] if reason == "stop" and ids else ids
        texts.append("".join(stream.step(backend, token) or "" for token in kept))
    return dataclasses.replace(generation, texts=tuple(texts))
