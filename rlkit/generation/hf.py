"""Generator on plain transformers ``generate``: the reference for vLLM's outputs and the fallback where
vLLM is not installed.

Logprobs come from the processed scores (after temperature and top-k/top-p), the same convention as the
vLLM generator's ``processed_logprobs``. Prompts are left-padded for batching; completions stop at any EOS
id (the list in ``generation_config.json``, as vLLM reads it, plus the tokenizer's) or a stop string.
Slower than vLLM at scale, fine for tiny models. On the GPU where there is one (fp32), else on the CPU.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Iterable

import torch

from rlkit.config.components import GenerationConfig
from rlkit.generation.base import Generation, KeepsItsMemory, SamplingSettings


class HFGenerator(KeepsItsMemory):
    def __init__(self, model_path: str | Path, cfg: GenerationConfig, max_model_len: int, seed: int = 0):
        from transformers import AutoModelForCausalLM, AutoTokenizer

        self.cfg = cfg
        self.model_path = str(model_path)
        self.max_model_len = max_model_len
        self.device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
        self.model = AutoModelForCausalLM.from_pretrained(self.model_path, dtype=torch.float32).eval().to(self.device)
        self.tokenizer = AutoTokenizer.from_pretrained(self.model_path)
        self.seed = seed
        listed = self.model.generation_config.eos_token_id
        listed = [listed] if isinstance(listed, int) else list(listed or [])
        ids = [self.tokenizer.eos_token_id] + listed  # the tokenizer's first
        self.eos_token_ids = [i for i in dict.fromkeys(ids) if i is not None]

    @torch.no_grad()
    def generate(self, prompt_token_ids: list[list[int]], n: int, sampling: SamplingSettings) -> Generation:
        tok = self.tokenizer
        pad, eos = tok.pad_token_id, self.eos_token_ids
        width = max(len(p) for p in prompt_token_ids)
        rows = [p for p in prompt_token_ids for _ in range(n)]
        ids = torch.tensor([[pad] * (width - len(p)) + list(p) for p in rows])
        mask = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in rows])
        with torch.random.fork_rng():
            torch.manual_seed(self.seed if sampling.seed is None else sampling.seed)
            out = self.model.generate(
                input_ids=ids.to(self.device),
                attention_mask=mask.to(self.device),
                do_sample=sampling.temperature > 0,
                temperature=sampling.temperature if sampling.temperature > 0 else None,
                top_p=sampling.top_p if sampling.temperature > 0 else None,
                top_k=(sampling.top_k or 0) if sampling.temperature > 0 else None,
                max_new_tokens=sampling.max_new_tokens,
                stop_strings=list(sampling.stop_strings) or None,
                tokenizer=tok if sampling.stop_strings else None,
                pad_token_id=pad,
                eos_token_id=eos,
                output_scores=True,
                return_dict_in_generate=True,
            )
        new = out.sequences[:, width:]  # [B, steps]
        token_lp = self.model.compute_transition_scores(out.sequences, out.scores, normalize_logits=True)  # [B, steps]
        samples = []
        for i in range(new.shape[0]):
            seq = new[i].tolist()
            length = next((t + 1 for t, token in enumerate(seq) if token in eos), len(seq))
            text = tok.decode(seq[:length], skip_special_tokens=True)
            stopped = (length > 0 and seq[length - 1] in eos) or any(s in text for s in sampling.stop_strings)
            for s in sampling.stop_strings:
                text = text.split(s)[0]
            samples.append((seq[:length], token_lp[i, :length].cpu().tolist(), text, "stop" if stopped else "length"))
        return Generation.from_samples(prompt_token_ids, samples, n)

    @torch.no_grad()
    def update_weights(self, bucket: Iterable[tuple[str, torch.Tensor]]) -> None:
        """Checkpoint-named tensors into the model: its parameters, the buffers a checkpoint holds (DeepSeek-V3's
        score-correction bias), and one expert's projections into the experts' stacked tensors, where transformers
        keeps them so (``experts.gate_up_proj`` [E, 2I, H] = [gate; up] per expert, ``experts.down_proj`` [E, H, I],
        as its checkpoint conversion stacks them)."""
        params = {**dict(self.model.named_buffers()), **dict(self.model.named_parameters())}
        for name, tensor in bucket:
            if name in params:
                params[name].copy_(tensor)
            elif (stacked := _stacked_expert_slot(params, name)) is not None:
                stacked.copy_(tensor)
            elif not (name == "lm_head.weight" and self.model.config.tie_word_embeddings):  # tied: nothing to load
                raise KeyError(f"generator model has no parameter {name!r}")

    def reset_prefix_cache(self) -> None:
        """No cache survives between calls to ``generate``."""

    def close(self) -> None:
        self.model = None

    def __repr__(self) -> str:
        return f"HFGenerator({Path(self.model_path).name})"


_EXPERT = re.compile(r"^(.*\.experts)\.(\d+)\.(gate_proj|up_proj|down_proj|w1|w3|w2)\.weight$")


def _stacked_expert_slot(params: dict[str, torch.Tensor], name: str) -> torch.Tensor | None:
    """The view of the stacked experts' tensor that checkpoint tensor ``name`` (one expert's projection) fills, or
    None where ``name`` is not one or the model keeps its experts apart."""
    match = _EXPERT.match(name)
    if match is None:
        return None
    prefix, expert, part = match.group(1), int(match.group(2)), match.group(3)
    if part in ("down_proj", "w2"):
        down = params.get(prefix + ".down_proj")
        return None if down is None else down[expert]
    gate_up = params.get(prefix + ".gate_up_proj")
    if gate_up is None:
        return None
    half = gate_up.shape[1] // 2
    return gate_up[expert, :half] if part in ("gate_proj", "w1") else gate_up[expert, half:]
