"""Component demo: on a fresh tiny model, generate with vLLM, score the same tokens with the Megatron
policy, take one training step, refit the generator, generate again, and print the figures."""

from __future__ import annotations

import tempfile
import time

import torch

from rlkit.config.components import GenerationConfig, PolicyConfig
from rlkit.generation.base import SamplingSettings
from rlkit.models import make_model
from rlkit.models.tokenizer import build_char_tokenizer
from rlkit.policy.factory import in_process_policy
from rlkit.stages.batching import trajectories_from_generation
from rlkit.weight_sync import ColocatedWeightSync


def _mismatch(policy, batch) -> tuple[float, float]:
    diff = (policy.logprobs(batch.input_ids, batch.attention_mask).logprobs - batch.generator_logprobs).abs()
    diff = diff[batch.loss_mask]
    return diff.max().item(), diff.mean().item()


def run_demo(preset: str = "tiny", family: str = "qwen2", prompts: int = 32, samples: int = 4) -> dict[str, float]:
    from rlkit.generation.vllm import VllmGenerator

    figures: dict[str, float] = {}
    with tempfile.TemporaryDirectory() as tmp:
        path = make_model(tmp, preset, family, seed=0)
        policy = in_process_policy(PolicyConfig(model_name=str(path), train_micro_batch_size=32))
        t = time.perf_counter()
        generator = VllmGenerator(path, GenerationConfig(), max_model_len=128, seed=0)
        figures["vllm_start_s"] = time.perf_counter() - t
        tok = build_char_tokenizer()
        texts = [tok.apply_chat_template([{"role": "user", "content": f"{i}+{3 * i}"}], add_generation_prompt=True,
                                         tokenize=False) for i in range(prompts)]
        ids = [tok(x, add_special_tokens=False)["input_ids"] for x in texts]
        sampling = SamplingSettings(max_new_tokens=32, seed=0)

        t = time.perf_counter()
        gen = generator.generate(ids, samples, sampling)
        figures["generate_s"] = time.perf_counter() - t
        batch = trajectories_from_generation(gen, tok.pad_token_id, texts, tokenizer=tok)
        figures["generated_tokens"] = int(batch.loss_mask.sum())
        figures["logprob_diff_max_before"], figures["logprob_diff_mean_before"] = _mismatch(policy, batch)

        adv = torch.randn(batch.batch_size, 1, generator=torch.Generator().manual_seed(0)) * batch.loss_mask

        def loss_fn(logprobs, micro, counts):
            loss = -(micro.advantages * logprobs * micro.loss_mask).sum() / counts.valid_tokens
            return loss, {"loss": loss.detach()}

        t = time.perf_counter()
        step = policy.train_step(batch.with_(advantages=adv), loss_fn)
        figures["train_step_s"] = time.perf_counter() - t
        figures["grad_norm"] = step.grad_norm
        figures["logprob_diff_max_stale"], _ = _mismatch(policy, batch)

        report = ColocatedWeightSync().sync(policy, generator)
        figures["refit_s"] = report.seconds
        figures["refit_mb"] = report.bytes_moved / 1e6
        gen = generator.generate(ids, samples, SamplingSettings(max_new_tokens=32, seed=1))
        batch = trajectories_from_generation(gen, tok.pad_token_id, texts, tokenizer=tok)
        figures["logprob_diff_max_after"], figures["logprob_diff_mean_after"] = _mismatch(policy, batch)
        generator.close()
        policy.close()

    print(f"model: {preset} {family}")
    width = max(map(len, figures))
    for k, v in figures.items():
        print(f"  {k:<{width}}  {v:.6g}")
    print("generator and policy agree within 1e-3 before and after the refit:", "yes" if agrees(figures) else "NO")
    return figures


def agrees(figures: dict[str, float]) -> bool:
    """The demo's check: vLLM's and the policy's logprobs within 1e-3 before the step and after the refit."""
    return figures["logprob_diff_max_after"] < 1e-3 and figures["logprob_diff_max_before"] < 1e-3
