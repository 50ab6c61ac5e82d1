"""The CPU engine's MoE expert reload finds each MoE family's experts where the family table says they live."""

import pytest

from rlkit.generation.vllm_cpu_kernels import moe_layers_with_experts_in
from rlkit.models.families import FAMILIES


@pytest.mark.parametrize("family", [f for f in FAMILIES if f.moe], ids=lambda f: f.name)
def test_expert_weights_are_found_under_the_family_tables_prefix(family):
    gate, up, down = family.expert_names
    names = [f"model.layers.{i}.{family.expert_prefix}experts.{e}.{p}.weight" for i in (0, 3) for e in (0, 1)
             for p in (gate, up, down)]
    dense = ["model.layers.1.mlp.gate_proj.weight", "model.layers.2.self_attn.q_proj.weight",
             f"model.layers.4.{family.expert_prefix}gate.weight"]  # the router is no expert
    assert moe_layers_with_experts_in(names + dense) == [0, 3]
    assert moe_layers_with_experts_in(dense) == []
