"""A value model on Megatron-Core: the policy's ``GPTModel`` with its LM head replaced by a scalar head
(:class:`rlkit.policy.value_model.ValueModel`, for PPO's critic and reward-model training).

It is :class:`rlkit.policy.megatron.policy.MegatronAdapter` (the same build, HF conversion, parallel state, DDP and
gradient reductions as the policy) with three changes: the model's ``post_process`` flag is cleared after the build,
so it returns the final norm's output [s(/tp), b, h] instead of logits (the flag gates the head alone once built);
the output layer (untied models: a [V/tp, h] weight) is removed, so it has no gradient buffer or optimizer state;
and a ``value_head`` linear [1, h] (and a bias [1] for the critic) is added to the model before DDP wraps it, so its
gradient is summed over data parallel as every other one.

Tensor parallelism: the head is replicated on every TP rank, and its input is whole on each: without sequence
parallelism the decoder's last row-parallel linear all-reduced it; with sequence parallelism it is gathered from
the ranks' sequence slices by a gather whose backward only splits (the loss is computed whole on every rank, so the
gradient arriving at the gathered states is already complete). The head's gradient is then the same on every rank
(no reduction), and the hidden states' gradient is complete on each (no all-reduce, unlike a vocabulary-parallel
head's partial one). Its initial weight comes from a generator seeded with the model's seed, so every rank draws the
same (transformers' rule: normal(0, initializer_range), bias 0).

Deliberate simplifications: fp32, every weight trained (no adapters, no bf16 copy), no pipeline or context
parallelism, no Mixture-of-Experts model, data parallel 1 (the value model runs in the driver's process, beside an
in-process policy in its layout or in one process's beside Ray workers); each is refused with the reason and fix.
"""

from __future__ import annotations

from typing import Mapping

import torch
from megatron.core.tensor_parallel.mappings import gather_from_sequence_parallel_region
from torch import Tensor

from rlkit.config.components import PolicyConfig
from rlkit.errors import ConfigError
from rlkit.models.factory import read_hf_config
from rlkit.policy.megatron.policy import MegatronAdapter

HEAD = "value_head"  # the head's module name in the GPTModel
HF_HEAD = "score"  # transformers' classification models' head


def value_model_policy_config(policy: PolicyConfig, folder: str) -> PolicyConfig:
    """``policy``'s settings for a value model on ``folder``: the same backend section (layout), fp32, no adapters;
    a problem it cannot run is a ``ConfigError`` naming the fix."""
    mc = policy.megatron_cfg
    problems = []
    if mc.pipeline_model_parallel_size > 1 or mc.context_parallel_size > 1:
        problems.append("the Megatron value model runs without pipeline and context parallelism (its head sits on "
                        "the last stage only; not built). Fix: critic.backend=transformers (or reward_model.backend), "
                        "or policy.megatron_cfg.pipeline_model_parallel_size=1 and context_parallel_size=1")
    from rlkit.policy.megatron.moe import is_moe

    if is_moe(read_hf_config(folder)):
        problems.append(f"{folder}: a Mixture-of-Experts model; the Megatron value model is built for dense decoders. "
                        "Fix: critic.backend=transformers (or reward_model.backend)")
    if problems:
        raise ConfigError(problems)
    return policy.model_copy(update={"model_name": folder, "model_preset": None, "precision": "float32",
                                     "lora_cfg": policy.lora_cfg.model_copy(update={"enabled": False})})


class _ValueAdapter(MegatronAdapter):
    """MegatronAdapter whose model ends in a scalar head (see the module docstring)."""

    def __init__(self, cfg: PolicyConfig, seed: int, bias: bool):
        self.bias = bias  # (read by the build, which the base's constructor runs)
        super().__init__(cfg, seed)

    def _build_model(self):
        gpt = super()._build_model()
        gpt.post_process = False  # the final norm's output, no logits (the head's flag alone, once built)
        if "output_layer" in gpt._modules:  # its [V/tp, h] weight (untied): never used, never trained
            del gpt.output_layer
        hidden = self.arch.hidden_size
        head = torch.nn.Linear(hidden, 1, bias=self.bias, device=next(gpt.parameters()).device)
        gen = torch.Generator().manual_seed(self._seed)  # the same draw on every TP rank
        std = float(read_hf_config(self.cfg.model_name).get("initializer_range", 0.02))
        with torch.no_grad():
            head.weight.copy_(torch.randn(1, hidden, generator=gen) * std)
            if head.bias is not None:
                head.bias.zero_()
        gpt.add_module(HEAD, head)
        return gpt

    def _params_by_global_name(self) -> dict[str, Tensor]:  # the decoder's (what the HF conversion fills)
        return {n: p for n, p in super()._params_by_global_name().items() if not n.startswith(HEAD + ".")}

    def _megatron_to_hf_groups(self, full):
        """The decoder's HF groups without ``lm_head.weight`` (there is no output layer to export; a classification
        model has none): converted as a tied model's, whose last group holds the final norm alone."""
        import dataclasses

        from rlkit.policy.megatron import convert

        return convert.megatron_to_hf_groups(full, dataclasses.replace(self.arch, tie_word_embeddings=True))


class MegatronValueModel:
    """A :class:`rlkit.policy.value_model.ValueModel` on Megatron-Core in ``policy``'s layout (module docstring)."""

    def __init__(self, policy: PolicyConfig, folder: str, bias: bool = True, seed: int = 0):
        cfg = value_model_policy_config(policy, folder)
        self.adapter = _ValueAdapter(cfg, seed, bias)
        if self.adapter.dp_size > 1:
            dp = self.adapter.dp_size
            self.close()
            raise ConfigError([f"the Megatron value model runs on one data-parallel rank (one process, or the ranks of "
                               f"one tensor-parallel group); this layout has {dp} (not built). Fix: "
                               "policy.megatron_cfg.tensor_model_parallel_size equal to the number of ranks"])
        self.module = self.adapter.model
        self.sequence_parallel = self.adapter.layout.sequence_parallel

    @property
    def head(self) -> torch.nn.Linear:
        return getattr(self.adapter.model, HEAD)

    def head_values(self, input_ids: Tensor, attention_mask: Tensor) -> Tensor:
        """input_ids [b, t] -> the head's output [b, t] (fp32, on the ids' device). Causal attention keeps the right
        padding out of the real positions, as the policy's logits do."""
        a = self.adapter
        t = input_ids.shape[1]
        ids = torch.nn.functional.pad(input_ids, (0, a._padded_length(t) - t))
        hidden = a._stage_forward(ids)  # [s(/tp), b, h]
        if self.sequence_parallel:
            hidden = gather_from_sequence_parallel_region(hidden, tensor_parallel_output_grad=False)
        values = self.head(hidden)[..., 0].t()  # [b, s]
        return values[:, :t].float().to(input_ids.device)

    def named_trained_parameters(self) -> list[tuple[str, Tensor]]:
        return [(n, p) for n, p in self.adapter.model.named_parameters() if p.requires_grad]

    def microbatch_starting(self, index: int, count: int) -> None:
        self.adapter.microbatch_starting(index, count)

    def reduce_grads(self) -> None:
        self.adapter.reduce_grads()

    def grad_norm(self) -> float:
        return self.adapter.grad_norm()

    def export_hf_state(self) -> dict[str, Tensor]:
        """The decoder under transformers' names (gathered over TP) and the head as ``score.*``."""
        state = {name: t.detach().clone() for group in self.adapter.export_hf_groups() for name, t in group}
        for name, t in self.head.named_parameters():
            state[f"{HF_HEAD}.{name}"] = t.detach().clone()
        return state

    def load_hf_state(self, hf: Mapping[str, Tensor]) -> None:
        """Full HF-named tensors (a classification model's: ``model.*`` and ``score.*``) into this model."""
        self.adapter.copy_hf_state({k: v for k, v in hf.items() if not k.startswith(HF_HEAD + ".")}
                                   | _lm_head_placeholder(self.adapter, hf))
        with torch.no_grad():
            for name, t in self.head.named_parameters():
                t.copy_(hf[f"{HF_HEAD}.{name}"])

    def close(self) -> None:
        if self.adapter is not None:
            self.adapter.close()
        self.adapter = self.module = None

    def __repr__(self) -> str:
        return f"MegatronValueModel({self.adapter!r})"


def _lm_head_placeholder(adapter: MegatronAdapter, hf: Mapping[str, Tensor]) -> dict[str, Tensor]:
    """The conversion of an untied model reads ``lm_head.weight`` (for the removed output layer, then dropped): a
    classification model's state has none, so an empty stand-in of its shape."""
    if adapter.arch.tie_word_embeddings or "lm_head.weight" in hf:
        return {}
    return {"lm_head.weight": torch.empty(adapter.arch.vocab_size, adapter.arch.hidden_size, device="meta")}

