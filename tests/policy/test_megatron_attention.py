"""SDPAttention (torch's fused attention, causal by flag) against Megatron's own unfused DotProductAttention
on the same inputs: causal GQA self-attention, fp32 and bf16, values and gradients.

Bounds against Megatron's unfused attention in fp32 (values absolute, gradients relative to their largest
entry), measured 2026-11-30: fp32 SDPA 5.4e-7 / 3.8e-7 (bound 5e-6); in bf16 Megatron's own unfused path is
1.1e-2 / 6.9e-3 off and SDPA 1.1e-2 / 8.0e-3 (bound 2e-2 for both)."""

import pytest
import torch

from rlkit.policy.megatron import parallel
from rlkit.policy.megatron.attention import SDPAttention
from rlkit.policy.megatron.build import Architecture, transformer_config


@pytest.fixture(scope="module")
def config():
    parallel.init_parallel(parallel.ParallelLayout(), seed=0)
    arch = Architecture(family="llama", hidden_size=128, num_layers=1, num_attention_heads=4, num_key_value_heads=2,
                        head_dim=32, ffn_hidden_size=256, vocab_size=64, max_position_embeddings=64, rope_theta=1e4,
                        rms_norm_eps=1e-6, tie_word_embeddings=False, qkv_bias=False)
    yield transformer_config(arch)
    parallel.destroy_parallel()
    parallel.release_process_group()


def attention_pair(config, dtype):
    import dataclasses

    from megatron.core.transformer.dot_product_attention import DotProductAttention
    from megatron.core.transformer.enums import AttnMaskType

    config = dataclasses.replace(config, params_dtype=dtype, bf16=dtype == torch.bfloat16)
    return [cls(config, layer_number=1, attn_mask_type=AttnMaskType.causal, attention_type="self")
            for cls in (DotProductAttention, SDPAttention)]


def run(module, q, k, v):
    """Output and q/k/v gradients, on the device Megatron's attention buffers live on (CUDA where present)."""
    device = "cuda" if torch.cuda.is_available() else "cpu"
    q, k, v = (t.detach().to(device).requires_grad_() for t in (q, k, v))
    out = module(q, k, v, attention_mask=None)
    (out.float() * torch.linspace(-1, 1, out.numel(), device=device).view_as(out)).sum().backward()
    return out.float().cpu(), [t.grad.float().cpu() for t in (q, k, v)]


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
def test_sdpa_attention_matches_megatron_unfused_attention(config, dtype):
    g = torch.Generator().manual_seed(0)
    s, b = 48, 3
    q = torch.randn(s, b, 4, 32, generator=g)  # [sq, b, heads, hn]
    k, v = (torch.randn(s, b, 2, 32, generator=g) for _ in range(2))  # 2 KV groups (GQA)
    exact_out, exact_grads = run(attention_pair(config, torch.float32)[0], q, k, v)
    unfused, sdpa = attention_pair(config, dtype)
    cast = [t.to(dtype) for t in (q, k, v)]
    (u_out, u_grads), (s_out, s_grads) = run(unfused, *cast), run(sdpa, *cast)
    assert s_out.shape == (s, b, 128)
    bound = 5e-6 if dtype == torch.float32 else 2e-2
    for out, grads in ((u_out, u_grads), (s_out, s_grads)):
        assert (out - exact_out).abs().max() < bound
        assert all((a - e).abs().max() < bound * e.abs().max() for a, e in zip(grads, exact_grads))
    # causal: the first position attends to itself only, so its context is its own value row (GQA group 0)
    assert torch.allclose(s_out[0, :, :32], v[0, :, 0].to(dtype).float(), atol=bound)
